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
// Consumers work in steps of KS column tiles (1 or 2; two give each warp two independent decode
// chains between waits): issue step q's 4 KS wgmma m64nBNk16 as one group, decode step q + 1's
// tiles (waiting on their full[slot]) while those run, then, once step q - 1's group has completed
// (wgmma_wait<1>), release its tiles' slots: one arrival per warp on empty[slot] (8 per phase).
// No block-wide barrier in the K loop: the warpgroups drift freely.
// Several weights in one launch (Q4gWsParams, up to 3 with the same in_features and quant
// parameters: q, k and v, or gate and up): row blocks of weight 0, then of 1, then of 2
// (blk_end = running sums of ceil(RT_i / 8)); each block works on one weight as above.
// Work units and split-K (DP + split tail): a unit is one (row block, token tile) pair, numbered
// token tile by token tile. Units [0, dp_units) run one
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
  CUtensorMap wmap[kQ4gMaxSegs];       // codes [RT, KT * 128 u32]: boxes 128 x 8
  CUtensorMap smap[kQ4gMaxSegs];       // absmax [RT, KT * 16] f32 / u8: boxes 16 x 8
  Q4Device w[kQ4gMaxSegs];
  const float* bias[kQ4gMaxSegs];      // [rows] or null
  void* out[kQ4gMaxSegs];              // [T, rows]
  int blk_end[kQ4gMaxSegs];            // row blocks of weights 0..i
  int nseg;
  int T;
  int n_rb, n_tt;  // row blocks (all weights), token tiles
  // split tail: units [dp_units, n_rb * n_tt) split ksplit ways, kps column
  // tiles per split (kps = KT when ksplit = 1); partial: ksplit x BN x 128 floats per split unit;
  // tickets: one zeroed counter per split unit
  int dp_units = 0, ksplit = 1, kps = 0;
  float* partial = nullptr;
  int* tickets = nullptr;
};
__host__ __device__ constexpr int q4g_ws_smem_bytes(int bn, int s) {
  return 1024 + s * (bn * 128 + 8 * (512 + 64)) + kQ4gLutBytes + (16 + 256) * 4 + 2 * s * 8;  // absmax: 64 (f32) max
}

// A unit's row block and token tile: weight seg (found from blk_end), its row block blk within that
// weight, token tile by.
__device__ __forceinline__ void q4g_unit_coords(const Q4gWsParams& p, int unit, int& seg, int& blk, int& by) {
  blk = unit % p.n_rb;
  by = unit / p.n_rb;
  seg = 0;
  while (seg + 1 < p.nseg && blk >= p.blk_end[seg]) ++seg;
  if (seg > 0) blk -= p.blk_end[seg - 1];
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

template <typename TA, typename TO, bool DQ, int BN, int S, int KS>
__global__ void __launch_bounds__(kQ4gWsThreads, 1) gemm_q4_ws_kernel(const __grid_constant__ Q4gWsParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int RTB = 8, ABS = DQ ? 16 : 64, XS = BN * 128, WS = RTB * 512, SS = RTB * ABS;
  constexpr int RTW = 8;  // row tiles of the weight per block
  constexpr int SST = SS;  // absmax bytes of a stage
  static_assert(S >= 3 * KS && (KS == 1 || KS == 2), "gemm_q4_ws: stages");
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
  q4g_unit_coords(p, unit, seg, blk, by);
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
      }
    }
    return;
  }

  // ---- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int cw = warp - 4;  // consumer warp: row tile cw of the block, warpgroup cw / 4
  const Q4Device& W = p.w[seg];
  const int64_t my_rt = rt0 + cw;
  const float w_offset = W.offset;
  const uint32_t my_abs = uint32_t(cw * ABS);
  const Q4gNested<DQ> nested(W, my_rt, g);
  float nab0[KS] = {}, nab1[KS] = {};  // DQ: the nested absmax of the next step's tiles
  auto nested_load = [&](int q) {
#pragma unroll
    for (int j = 0; j < KS; ++j) nested.load(kt0 + q * KS + j, nab0[j], nab1[j]);
  };
  if constexpr (DQ) nested_load(0);
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  const uint32_t lane8 = 8u * lane;
  constexpr int AR = 16 * KS;  // A registers of a step
  const int NQ = NK / KS;  // steps of KS column tiles (the host makes NK a multiple of KS)

  // Software-pipelined over this block's steps q = 0 .. NQ - 1 (column tiles kt0 + q KS ..): issue
  // step q's wgmmas (A decoded one step earlier), then decode step q + 1 while they (and q - 1's)
  // run, then wait for q - 1's group and release its tiles' slots. Three A register sets: q - 1's
  // and q's stay untouched while their groups are in flight. A step holds at most 3 KS slots (S >=
  // 3 KS: the producer fills the others ahead).
  auto decode = [&](int q, uint32_t (&A)[AR]) {
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int i = q * KS + j;
      mbar_wait(&full[i % S], uint32_t(i / S) & 1u);
    }
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const int slot = (q * KS + j) % S;
      q4g_decode_a<TA, DQ>(wq_s + slot * WS + cw * 512 + lane * 16, sc_s + slot * SST + my_abs, lut_s, lane8, g, t,
                           s_nested, nab0[j], nab1[j], w_offset, &A[16 * j]);
    }
    if (DQ && q + 1 < NQ) nested_load(q + 1);
  };
  auto step = [&](int q, const uint32_t (&Aq)[AR], uint32_t (&An)[AR]) {
    uint32_t xs[KS];
#pragma unroll
    for (int j = 0; j < KS; ++j) xs[j] = xs_s + uint32_t(((q * KS + j) % S) * XS);
    q4g_mma_tiles<TA, BN, KS>(acc, Aq, xs);
    if (q + 1 < NQ) decode(q + 1, An);
    wgmma_wait<1>();  // step q - 1's group is done: its slots may be refilled
    if (q > 0) {
      __syncwarp();
      if (lane == 0) {
#pragma unroll
        for (int j = 0; j < KS; ++j) mbar_arrive(&empty[((q - 1) * KS + j) % S]);
      }
    }
  };

  uint32_t A0[AR], A1[AR], A2[AR];
  decode(0, A0);
  int q = 0;
  for (; q + 2 < NQ; q += 3) {
    step(q, A0, A1);
    step(q + 1, A1, A2);
    step(q + 2, A2, A0);
  }
  if (q < NQ) step(q, A0, A1);
  if (q + 1 < NQ) step(q + 1, A1, A2);
  wgmma_wait<0>();
  wgmma_fence_regs(acc);
  if (split) {  // store this split's slice; the last of the unit's splits sums all of them in z order
    __shared__ int s_last;
    const int ct = tid - 128;
    float* const slices = p.partial + int64_t(sq) * p.ksplit * (BN / 2) * 256 + ct;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) __stcg(slices + (int64_t(kz) * (BN / 2) + i) * 256, acc[i]);
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
#else
  __trap();  // built only for sm_90a (gemm_q4_wgmma_supported() says so before any launch)
#endif
}

}  // namespace nf4flash::cuda
