// Fused 4-bit GEMM, warp-specialized (wgmma + TMA, sm_90a): the same product and arithmetic as
// gemm_q4_wgmma_kernel (kernels/gemm_q4_wgmma.cuh; same decode into RS wgmma A fragments, same
// epilogue), with the copies moved off the compute warps:
//   warps 0-3  producer warpgroup (setmaxnreg down to 40 registers): lane 0 of warp 0 walks the K
//              loop S stages ahead, per column tile kt issuing three TMA tile copies that complete
//              on the stage's `full` mbarrier: x [BN x 64] (tensor map over x [T, cols], 128-byte
//              swizzle = wgmma's B layout), the block's 8 row tiles of codes [8 x 512 bytes]
//              (tensor map over the tiles as [RT, KT * 512 bytes]) and their absmax [8 x 64 or 16
//              bytes] (over [RT, KT * 64 or 16 bytes]); rows past T or RT arrive zero-filled;
//   warps 4-11 two consumer warpgroups (setmaxnreg up to 232), 64 weight rows each (consumer warp
//              c = warp - 4 decodes row tile c), BN tokens.
// Consumers issue tile kt's 4 wgmma m64nBNk16, decode tile kt + 1 (waiting on its full[slot])
// while those run, then, once tile kt - 1's group has completed (wgmma_wait<1>), release that
// tile's slot: one arrival per warp on empty[slot] (8 per phase). No block-wide barrier in the K
// loop: the warpgroups drift freely.
// Several weights in one launch (Q4gWsParams, up to 3 with the same in_features and quant
// parameters: q, k and v, or gate and up): row blocks of weight 0, then of 1, then of 2
// (blk_end = running sums of ceil(RT_i / 8)); each block works on one weight as above.
// SWIGLU (2 weights, gate and up, same rows): a block covers 4 row tiles (64 rows) of each; the
// producer brings 4 row tiles of gate codes into slots 0-3 and 4 of up into 4-7, so warpgroup 0
// multiplies gate rows and warpgroup 1 the same up rows; at the end warpgroup 0 parks its
// accumulators (rounded to the compute dtype with bias, as linear() would store them) in the
// drained ring, and warpgroup 1 stores out = silu(gate) * up (SiluMulOp, rounded): the result of
// two GEMMs and silu_mul, bit for bit, without the [T, rows] gate buffer.
// Work units and split-K (DP + split tail): a unit is one (row block, token tile) pair, numbered
// token tile by token tile (raster_rows: row block by row block). Units [0, dp_units) run one
// block each over the whole K; the rest (the last, partial wave) run ksplit blocks each, block z
// over column tiles [z * kps, (z + 1) * kps), so the tail fills the SMs a partial wave would leave
// idle. A split block stores its f32 accumulators (register order, coalesced) to its slice of
// `partial`, then takes a ticket on its unit's counter; the last of the ksplit blocks adds the
// slices in z order, all read back from L2 (the same sum whichever block comes last: results are
// deterministic), stores the unit like an unsplit block and resets the counter to zero.
// Grid: dp_units + (units - dp_units) x ksplit blocks (1D); 384 threads.
// Shared memory: [S][BN*128] x tiles (1024-aligned), [S][8][512] codes, [S][8][64 or 16] absmax,
// the code-pair table (64 KiB of f32 pairs), 16 codes, 256 nested codes, 2S mbarriers.
#pragma once
#include <cuda.h>  // CUtensorMap

#include "backend/cuda/kernels/gemm_q4_wgmma.cuh"
#include "backend/cuda/kernels/elementwise.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"

namespace nf4flash::cuda {

constexpr int kQ4gWsThreads = 384;
constexpr int kQ4gMaxSegs = 3;

// Kernel parameters (passed __grid_constant__: the tensor maps must live in parameter space).
struct Q4gWsParams {
  CUtensorMap xmap;                    // x [T, cols]: boxes BN x 64, 128-byte swizzle
  CUtensorMap wmap[kQ4gMaxSegs];       // codes [RT, KT * 128 u32]: boxes 128 x 8 (SWIGLU: x 4)
  CUtensorMap smap[kQ4gMaxSegs];       // absmax [RT, KT * 16] f32 / u8: boxes 16 x 8 (SWIGLU: x 4)
  Q4Device w[kQ4gMaxSegs];
  const float* bias[kQ4gMaxSegs];      // [rows] or null
  void* out[kQ4gMaxSegs];              // [T, rows]; SWIGLU: out[0] only
  int blk_end[kQ4gMaxSegs];            // row blocks of weights 0..i
  int nseg;
  int T;
  int n_rb, n_tt;    // row blocks (all weights), token tiles
  bool raster_rows;  // units numbered row block by row block rather than token tile by token tile
  // split tail (not with SWIGLU): units [dp_units, n_rb * n_tt) split ksplit ways, kps column
  // tiles per split (kps = KT when ksplit = 1); partial: ksplit x BN x 128 floats per split unit;
  // tickets: one zeroed counter per split unit
  int dp_units = 0, ksplit = 1, kps = 0;
  float* partial = nullptr;
  int* tickets = nullptr;
  bool fixup_kernel = false;  // split blocks only store their slices; gemm_q4_split_reduce_kernel sums
};
__host__ __device__ constexpr int q4g_ws_smem_bytes(int bn, int s) {
  return 1024 + s * (bn * 128 + 8 * (512 + 64)) + kQ4gLutBytes + (16 + 256) * 4 + 2 * s * 8;  // absmax: 64 (f32) max
}

// A unit's row block and token tile: weight seg (SEGS: found from blk_end; else 0), its row block
// blk within that weight, token tile by.
template <bool SEGS>
__device__ __forceinline__ void q4g_unit_coords(const Q4gWsParams& p, int unit, int& seg, int& blk, int& by) {
  const int bx = p.raster_rows ? unit / p.n_tt : unit % p.n_rb;
  by = p.raster_rows ? unit % p.n_tt : unit / p.n_rb;
  seg = 0;
  blk = bx;
  if constexpr (SEGS) {
    while (seg + 1 < p.nseg && blk >= p.blk_end[seg]) ++seg;
    if (seg > 0) blk -= p.blk_end[seg - 1];
  }
}

// Sum of a split unit's ksplit slices in z order (thread ct's values at slices + (z * BN/2 + i) * 256),
// slice by slice so that all BN/2 loads of a slice are independent (a loop over z per value would
// serialize BN/2 L2 round trips).
template <int BN>
__device__ __forceinline__ void q4g_sum_slices(float (&acc)[BN / 2], const float* slices, int ksplit) {
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = __ldcg(slices + i * 256);
  for (int z = 1; z < ksplit; ++z) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] += __ldcg(slices + (int64_t(z) * (BN / 2) + i) * 256);
  }
}

template <typename TA, typename TO, bool DQ, int BN, int S, bool SWIGLU>
__global__ void __launch_bounds__(kQ4gWsThreads, 1) gemm_q4_ws_kernel(const __grid_constant__ Q4gWsParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int RTB = 8, ABS = DQ ? 16 : 64, XS = BN * 128, WS = RTB * 512, SS = RTB * ABS;
  constexpr int RTW = SWIGLU ? 4 : 8;  // row tiles of one weight per block
  // absmax of a stage: SWIGLU puts up's 4 row tiles at a 128-byte boundary (tensor copies need it)
  constexpr int AH = SWIGLU ? ((4 * ABS + 127) / 128) * 128 : 4 * ABS;
  constexpr int SST = SWIGLU ? 2 * AH : SS;
  static_assert(SST <= RTB * 64, "gemm_q4_ws: absmax stage exceeds its shared-memory share");
  static_assert(S >= 2, "gemm_q4_ws: stages");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base_s = (raw_s + 1023u) & ~1023u;
  const uint32_t xs_s = base_s, wq_s = xs_s + S * XS, sc_s = wq_s + S * WS, lut_s = sc_s + S * SST;
  uint32_t* const lut = reinterpret_cast<uint32_t*>(smem_raw + (lut_s - raw_s));
  float* const s_code = reinterpret_cast<float*>(lut + kQ4gLutBytes / 4);
  float* const s_nested = s_code + 16;
  uint64_t* const full = reinterpret_cast<uint64_t*>(s_nested + 256);
  uint64_t* const empty = full + S;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int KT = int(p.w[0].KT);
  // this block's unit, split index and column tiles (>= 1: the host sizes kps)
  const int b = int(blockIdx.x);
  const bool split = b >= p.dp_units;
  const int sq = split ? (b - p.dp_units) / p.ksplit : 0;  // index among the split units
  const int kz = split ? b - p.dp_units - sq * p.ksplit : 0;
  const int unit = split ? p.dp_units + sq : b;
  const int kt0 = kz * p.kps;
  const int NK = split ? min(KT, kt0 + p.kps) - kt0 : KT;
  int seg, blk, by;
  q4g_unit_coords<!SWIGLU>(p, unit, seg, blk, by);
  const int64_t rt0 = int64_t(blk) * RTW;
  const int n0 = by * BN;
  if (tid < 16) s_code[tid] = p.w[0].code[tid];  // same code table for every weight
  if constexpr (DQ) {
    for (int i = tid; i < 256; i += kQ4gWsThreads) s_nested[i] = p.w[0].nested_code[i];
  }
  if (tid == 0) mbar_init_ring(full, empty, S, 8);
  __syncthreads();
  q4g_fill_lut(lut_s, s_code);
  __syncthreads();

  if (warp < 4) {  // ---- producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp == 0 && lane == 0) {
      constexpr uint32_t bytes = uint32_t(XS + WS + SS);  // SS: both halves' boxes
      const int row0 = int(rt0);
      for (int i = 0; i < NK; ++i) {
        const int slot = i % S, kt = kt0 + i;
        if (i >= S) mbar_wait(&empty[slot], uint32_t((i / S) + 1) & 1u);
        mbar_expect_tx(&full[slot], bytes);
        tma_load_2d(xs_s + slot * XS, &p.xmap, kt * 64, n0, &full[slot]);
        tma_load_2d(wq_s + slot * WS, &p.wmap[seg], kt * 128, row0, &full[slot]);
        tma_load_2d(sc_s + slot * SST, &p.smap[seg], kt * 16, row0, &full[slot]);  // 16 absmax per row tile
        if constexpr (SWIGLU) {  // up's 4 row tiles after gate's
          tma_load_2d(wq_s + slot * WS + 4 * 512, &p.wmap[1], kt * 128, row0, &full[slot]);
          tma_load_2d(sc_s + slot * SST + AH, &p.smap[1], kt * 16, row0, &full[slot]);
        }
      }
    }
    return;
  }

  // ---- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int cw = warp - 4;  // consumer warp: row tile cw of the block, warpgroup cw / 4
  const int wseg = SWIGLU ? (cw >> 2) : seg;
  const Q4Device& W = p.w[wseg];
  const int64_t my_rt = rt0 + (SWIGLU ? (cw & 3) : cw);
  const float w_offset = W.offset;
  const uint32_t my_abs = uint32_t(SWIGLU ? (cw >> 2) * AH + (cw & 3) * ABS : cw * ABS);
  const Q4gNested<DQ> nested(W, my_rt, g);
  float nab0 = 0.f, nab1 = 0.f;
  nested.load(kt0, nab0, nab1);
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  const uint32_t lane8 = 8u * lane;

  // Software-pipelined over this block's column tiles i = 0 .. NK - 1 (tile kt0 + i): issue tile
  // i's wgmmas (A decoded one step earlier), then decode tile i + 1 while they (and i - 1's) run,
  // then wait for i - 1's group and release its slot. Three A register sets: i - 1's and i's stay
  // untouched while their groups are in flight.
  auto decode = [&](int i, uint32_t (&A)[16]) {
    const int slot = i % S;
    mbar_wait(&full[slot], uint32_t(i / S) & 1u);
    q4g_decode_a<TA, DQ>(wq_s + slot * WS + cw * 512 + lane * 16, sc_s + slot * SST + my_abs, lut_s, lane8, g,
                         t, s_nested, nab0, nab1, w_offset, A);
    if (DQ && i + 1 < NK) nested.load(kt0 + i + 1, nab0, nab1);
  };
  auto step = [&](int i, const uint32_t (&Ai)[16], uint32_t (&An)[16]) {
    q4g_mma_tile<TA, BN>(acc, Ai, xs_s + (i % S) * XS);
    if (i + 1 < NK) decode(i + 1, An);
    wgmma_wait<1>();  // tile i - 1's group is done: its slot may be refilled
    if (i > 0) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[(i - 1) % S]);
    }
  };

  uint32_t A0[16], A1[16], A2[16];
  decode(0, A0);
  int i = 0;
  for (; i + 2 < NK; i += 3) {
    step(i, A0, A1);
    step(i + 1, A1, A2);
    step(i + 2, A2, A0);
  }
  if (i < NK) step(i, A0, A1);
  if (i + 1 < NK) step(i + 1, A1, A2);
  wgmma_wait<0>();
  wgmma_fence_regs(acc);
  if constexpr (!SWIGLU) {
    if (split) {  // store this split's slice; the last of the unit's splits sums all of them in z order
      __shared__ int s_last;
      const int ct = tid - 128;
      float* const slices = p.partial + int64_t(sq) * p.ksplit * (BN / 2) * 256 + ct;
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) __stcg(slices + (int64_t(kz) * (BN / 2) + i) * 256, acc[i]);
      if (p.fixup_kernel) return;
      __threadfence();
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (ct == 0) s_last = atomicAdd(&p.tickets[sq], 1) == p.ksplit - 1;
      asm volatile("bar.sync 1, 256;\n" ::: "memory");
      if (!s_last) return;
      __threadfence();
      q4g_sum_slices<BN>(acc, slices, p.ksplit);
      if (ct == 0) p.tickets[sq] = 0;  // every split has taken its ticket: ready for the next launch
    }
    q4g_store<TO, BN>(static_cast<TO*>(p.out[seg]), W.rows, p.bias[seg], p.T, acc, my_rt * 16 + g, n0, t);
  } else {
    static_assert(std::is_same_v<TO, TA>, "gemm_q4_ws: SwiGLU writes the compute dtype");
    // Both warpgroups' wgmmas are done reading the ring before warpgroup 0 overwrites it.
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    float* const park = reinterpret_cast<float*>(smem_raw + (base_s - raw_s));  // [BN / 2][128]
    const int ct = tid & 127;
    const int64_t rows = W.rows, f0 = my_rt * 16 + g, f1 = f0 + 8;
    const float* const bias = p.bias[wseg];
    const float b0 = (bias && f0 < rows) ? bias[f0] : 0.f, b1 = (bias && f1 < rows) ? bias[f1] : 0.f;
    if (cw < 4) {
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) park[i * 128 + ct] = to_f32<TA>(from_f32<TA>(acc[i] + ((i & 2) ? b1 : b0)));
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    if (cw >= 4) {
      TA* const out = static_cast<TA*>(p.out[0]);
      const SiluMulOp op;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 4 * j + e, n = n0 + 8 * j + 2 * t + (e & 1);
          const int64_t f = (e & 2) ? f1 : f0;
          const float up = to_f32<TA>(from_f32<TA>(acc[i] + ((e & 2) ? b1 : b0)));
          if (n < p.T && f < rows) out[int64_t(n) * rows + f] = from_f32<TA>(op(park[i * 128 + ct], up));
        }
      }
    }
  }
#else
  __trap();  // built only for sm_90a (gemm_q4_wgmma_supported() says so before any launch)
#endif
}

// The split tail's sums as a second launch (NF4FLASH_Q4GEMM_SPLIT_FIXUP=kernel, for comparison with
// the in-kernel fixup): grid = split units, 256 threads; thread ct holds what consumer thread ct of
// the unit's blocks held (row tile ct / 32 of the row block, lane ct % 32), sums the ksplit slices
// in z order and stores like gemm_q4_ws_kernel.
template <typename TO, int BN>
__global__ void __launch_bounds__(256) gemm_q4_split_reduce_kernel(const __grid_constant__ Q4gWsParams p) {
  const int sq = int(blockIdx.x), ct = int(threadIdx.x);
  int seg, blk, by;
  q4g_unit_coords<true>(p, p.dp_units + sq, seg, blk, by);
  const int lane = ct & 31, g = lane >> 2, t = lane & 3;
  const int64_t my_rt = int64_t(blk) * 8 + (ct >> 5);
  float acc[BN / 2];
  q4g_sum_slices<BN>(acc, p.partial + int64_t(sq) * p.ksplit * (BN / 2) * 256 + ct, p.ksplit);
  q4g_store<TO, BN>(static_cast<TO*>(p.out[seg]), p.w[seg].rows, p.bias[seg], p.T, acc, my_rt * 16 + g, by * BN, t);
}

}  // namespace nf4flash::cuda
