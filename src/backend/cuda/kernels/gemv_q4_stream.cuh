// Stream-K fused 4-bit GEMV fed by the bulk copy engine (sm_90+), with fused epilogues.
//
//   out_s[n, r] = epilogue( sum_k x[n, k] * code[q_s(r, k)] * absmax_s(r, k) + bias_s[r] ),  n < T <= 8
//
// Weights: the tile16x64 layout of gemv_q4.cuh (512 bytes of codes per 16 rows x 64 columns, row
// tile rt's KT tiles contiguous), absmax per (row tile, col tile, row) [RT][KT][16] (f32, or u8
// codes for double quant decoded in the kernel). x: [T, cols] bf16/f16; f32 accumulation.
//
// Up to three weights ("segments") sharing `cols` and the 4-bit code run in one launch:
//   Store    : out_s [T, rows_s] = x W_s^T + b_s      (e.g. q, k and v projections together)
//   Residual : out   [T, rows]  += round(x W^T + b)   (o_proj / down_proj with the residual add:
//              rounded to the compute dtype first, then added in f32 and rounded: the unfused result)
//   SwiGLU   : out   [T, rows]   = silu(round(x G^T + bg)) * round(x U^T + bu), rounded (gate/up)
//
// Work decomposition ("stream-K"): a unit is one row tile (Store/Residual) or one (gate, up) row
// tile pair (SwiGLU: its gate tiles then its up tiles); the N = units * nsub * KT tiles of the
// launch, in unit-major order, are split into gridDim.x equal contiguous ranges, one per block, so
// every block streams the same number of bytes whatever the shapes. A unit cut between blocks is
// finished by the last block to arrive: each contributor writes its 16x8 (32x8) partial sums to
// `partials` [block][2][256] and bumps counters[unit]; the one that sees count == contributors-1
// adds the others' partials, runs the epilogue and resets the counter to 0 (graph-replay safe).
//
// Pipeline: one thread streams stages of up to kQsStageTiles tiles (16 KB of codes + their
// absmax, never crossing a unit half) into a kQsStages-deep shared-memory ring with
// cp.async.bulk, completing on a per-stage mbarrier; warps consume tile c of a stage for
// c = warp, warp + W, ... and release the slot on an `empty` mbarrier (one arrival per warp).
// Bytes in flight per SM no longer cost registers (the register-prefetch kernel peaked at 46% of
// copy bandwidth with 98 registers and 25% occupancy). Decoding is the one of gemv_q4_kernel: a
// per-lane replicated byte -> two-codes table, mma.m16n8k16 with the tokens as the n dimension.
#pragma once
#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"

namespace nf4flash::cuda {

constexpr int kQsStageTiles = 32;  // tiles per stage (16 KB of codes)
constexpr int kQsStages = 4;       // default ring depth (NF4FLASH_GEMV_STAGES: 2..kQsMaxStages)
constexpr int kQsMaxStages = 8;

struct Q4StreamKArgs {
  Q4StreamSeg seg[kQsMaxSegs];
  int64_t unit_end[kQsMaxSegs];  // Store/Residual: cumulative row tiles of segments 0..k
  float code[16];
  const float* nested_code;
  int64_t cols, KT, units, N;
  int log2_blocksize, log2_nested;
  int nseg, nsub, T, out_f32, ep;
  int stages;    // ring depth
  int nocompute; // diagnostics: stream the weights, skip the math (kernel-bench only)
  int x_stride;  // > 0: x staged in shared memory after the table, rows of x_stride bytes; 0: read from global
  const void* x;
  float* partials;  // [gridDim.x][2][256]
  int* counters;    // [units], zero between launches
};

template <bool DQ>
constexpr int qs_abs_bytes() { return DQ ? 16 : 64; }
template <bool DQ>
__host__ __device__ constexpr int qs_ring_bytes(int stages) { return stages * kQsStageTiles * (512 + qs_abs_bytes<DQ>()); }
constexpr int kQsLutBytes = 256 * 32 * 4;
template <bool DQ>
__host__ __device__ constexpr int qs_dyn_smem(int stages) { return qs_ring_bytes<DQ>(stages) + kQsLutBytes; }  // + staged x
// Row stride of x staged in shared memory: cols*2 + 16 bytes, so that the 8 lanes of a
// quarter-warp (two tokens x four 16-byte column groups) hit distinct banks.
__host__ __device__ constexpr int qs_x_stride(int64_t cols) { return int(cols * 2 + 16); }

// BULK: the weights arrive through the cp.async.bulk ring (stages = ring depth). !BULK: each warp
// loads its tiles of the next stage into registers (16-byte streaming loads) before decoding the
// current stage, as gemv_q4_kernel does; no ring (stages = 0), two blocks per SM.
template <typename TA, bool DQ, int W, bool BULK>
__global__ void __launch_bounds__(W * 32, BULK ? 1 : 2) gemv_q4_stream_kernel(const __grid_constant__ Q4StreamKArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int C = kQsStageTiles, AB = qs_abs_bytes<DQ>(), U = kQsStageTiles / W;
  const int S = BULK ? a.stages : 0;    // ring depth (0: no ring in the layout)
  const int SR = BULK ? a.stages : 1;   // the same as a divisor (never 0)
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring_codes = smem;                   // [S][C][512]
  uint8_t* ring_abs = smem + S * C * 512;       // [S][C][AB]
  uint32_t* lut = reinterpret_cast<uint32_t*>(smem + qs_ring_bytes<DQ>(S));  // [256][32]
  __shared__ float red[W][32][8];
  __shared__ float vals[256];
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];
  __shared__ __align__(8) uint64_t full[kQsMaxStages], empty[kQsMaxStages];
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int64_t N = a.N, B = gridDim.x, b = blockIdx.x;
  const int64_t start = b * N / B, end = (b + 1) * N / B;
  if (start >= end) return;  // whole block: owns no tile (tiny launches)

  if (tid < 16) s_bits[tid] = bits16<TA>(a.code[tid]);
  if constexpr (DQ) {
    for (int i = tid; i < 256; i += blockDim.x) s_nested_code[i] = a.nested_code[i];
  }
  if (BULK && tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], W);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const int64_t KT = a.KT, UT = int64_t(a.nsub) * KT;  // tiles per unit
  // (unit, half, first column tile, tile count) of the stage that starts at flat tile i
  // (divisions once per block; later stages advance incrementally: 64-bit divisions per stage
  // cost as much as the stage's math)
  struct Stage { int64_t i, u, kt; int sub, n; };
  auto stage_at = [&](int64_t i) {
    Stage s;
    s.i = i;
    s.u = i / UT;
    const int64_t rem = i - s.u * UT;
    s.sub = int(rem / KT);
    s.kt = rem - s.sub * KT;
    s.n = int(min(int64_t(C), min(KT - s.kt, end - i)));
    return s;
  };
  auto stage_next = [&](Stage s) {
    s.i += s.n;
    s.kt += s.n;
    if (s.kt == KT) {
      s.kt = 0;
      if (++s.sub == a.nsub) {
        s.sub = 0;
        ++s.u;
      }
    }
    s.n = int(min(int64_t(C), min(KT - s.kt, end - s.i)));
    return s;
  };
  // segment and row tile of (unit, half)
  auto seg_of = [&](int64_t u, int sub, int64_t& rt) -> int {
    if (a.nsub == 2) { rt = u; return sub; }
    int k = 0;
    while (k + 1 < a.nseg && u >= a.unit_end[k]) ++k;
    rt = u - (k ? a.unit_end[k - 1] : 0);
    return k;
  };

  // producer (thread 0): stage p_j at flat tile p_i
  Stage ps = stage_at(start);
  int p_j = 0;
  auto issue = [&]() {
    if (ps.i >= end) return;
    const Stage s = ps;
    int64_t rt;
    const int k = seg_of(s.u, s.sub, rt);
    const int slot = p_j % SR;
    if (p_j >= SR) mbar_wait(&empty[slot], unsigned((p_j / SR) - 1) & 1u);
    const unsigned cb = unsigned(s.n) * 512u, ab = unsigned(s.n) * AB;
    mbar_expect_tx(&full[slot], cb + ab);
    const int64_t tile0 = rt * KT + s.kt;
    bulk_g2s(ring_codes + slot * C * 512, a.seg[k].tiles + tile0 * 512, cb, &full[slot]);
    bulk_g2s(ring_abs + slot * C * AB, static_cast<const uint8_t*>(a.seg[k].absmax) + tile0 * AB, ab, &full[slot]);
    ps = stage_next(ps);
    ++p_j;
  };
  if (BULK && tid == 0) {
    for (int j = 0; j < S - 1; ++j) issue();
  }
  // register feed: this warp's U tiles (and absmax) of the stage at flat tile i
  struct Regs { uint4 w[U]; uint32_t ab[U]; };
  auto load_regs = [&](const Stage& s, Regs& r) {
    int64_t rt;
    const int k = seg_of(s.u, s.sub, rt);
    const int64_t tile0 = rt * KT + s.kt;
    const uint4* tp = reinterpret_cast<const uint4*>(a.seg[k].tiles) + tile0 * 32 + lane;
#pragma unroll
    for (int cc = 0; cc < U; ++cc) {
      const int c = warp + cc * W;
      if (c < s.n) {
        r.w[cc] = ld_stream_u4(tp + c * 32);
        if constexpr (DQ) r.ab[cc] = __ldg(static_cast<const uint8_t*>(a.seg[k].absmax) + (tile0 + c) * 16 + (lane & 15));
        else r.ab[cc] = __float_as_uint(__ldg(static_cast<const float*>(a.seg[k].absmax) + (tile0 + c) * 16 + (lane & 15)));
      }
    }
  };
  Regs cur, nxt;
  Stage pf = stage_at(start);  // register feed: the next stage to load
  if (!BULK) {
    load_regs(pf, cur);
    pf = stage_next(pf);
  }
  uint8_t* xs = smem + qs_dyn_smem<DQ>(S);
  pdl_trigger();
  pdl_wait();  // everything above reads weights only (PDL: may overlap the previous kernel)
  if (a.x_stride > 0) {  // stage x [T, cols] once (16-byte copies)
    const int per_row = int(a.cols / 8);
    for (int i = tid; i < a.T * per_row; i += blockDim.x) {
      const int n = i / per_row, c = i - n * per_row;
      reinterpret_cast<uint4*>(xs + n * a.x_stride)[c] =
          __ldg(reinterpret_cast<const uint4*>(static_cast<const TA*>(a.x) + int64_t(n) * a.cols) + c);
    }
  }

  q4_fill_lut<32>(lut, s_bits);
  __syncthreads();

  const uint32_t* lut_l = lut + lane;
  const int64_t cols = a.cols;
  const int tok = min(g, a.T - 1);
  const uint8_t* xrow = a.x_stride > 0 ? xs + tok * a.x_stride + 32 * t
                                       : reinterpret_cast<const uint8_t*>(static_cast<const TA*>(a.x) + int64_t(tok) * cols + 16 * t);
  auto block_of = [&](int64_t i) { return ((i + 1) * B - 1) / N; };  // block owning flat tile i
  auto start_of = [&](int64_t bb) { return bb * N / B; };

  float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
  Stage cs = stage_at(start);
  for (int j = 0; cs.i < end; ++j) {
    if (BULK && tid == 0) issue();
    const Stage s = cs;
    int64_t rt;
    const int k = seg_of(s.u, s.sub, rt);
    const int slot = BULK ? j % SR : 0;
    if (BULK) mbar_wait(&full[slot], unsigned(j / SR) & 1u);
    else if (pf.i < end) {
      load_regs(pf, nxt);
      pf = stage_next(pf);
    }
    const int64_t seg_rows = a.seg[k].rows;
    const float* seg_nested = a.seg[k].nested_absmax;
    const float seg_offset = a.seg[k].offset;
    int64_t my_row = rt * 16 + (lane & 15);
    my_row = my_row < seg_rows ? my_row : seg_rows - 1;
    const int64_t my_row_base = my_row * cols;
    const uint4* codes = reinterpret_cast<const uint4*>(ring_codes + slot * C * 512);
    const uint8_t* abs = ring_abs + slot * C * AB;
    if (BULK && a.nocompute) {  // diagnostics: touch one word per stage so the wait is not optimized away
      if (lane == 0 && codes[warp].x == 0x12345678u && abs[0] == 0x5au) acc0[0] += 1.f;
    } else {
#pragma unroll
    for (int cc = 0; cc < C / W; ++cc) {
      const int c = warp + cc * W;
      if (c >= s.n) break;  // warp-uniform
      const int64_t kt = s.kt + c;
      const uint4 wq = BULK ? codes[c * 32 + lane] : cur.w[cc];
      float sv;
      if constexpr (DQ) {
        const uint32_t qa = BULK ? abs[c * 16 + (lane & 15)] : cur.ab[cc];
        const int64_t nb = ((my_row_base + kt * 64) >> a.log2_blocksize) >> a.log2_nested;
        sv = __fadd_rn(__fmul_rn(s_nested_code[qa], __ldg(seg_nested + nb)), seg_offset);
      } else {
        sv = BULK ? reinterpret_cast<const float*>(abs)[c * 16 + (lane & 15)] : __uint_as_float(cur.ab[cc]);
      }
      const uint4* xp = reinterpret_cast<const uint4*>(xrow + kt * 128);
      uint4 xa, xb;
      if (a.x_stride > 0) {
        xa = xp[0];
        xb = xp[1];
      } else {
        xa = __ldg(xp);
        xb = __ldg(xp + 1);
      }
      const float sg = __shfl_sync(0xffffffffu, sv, g);
      const float sg8 = __shfl_sync(0xffffffffu, sv, g + 8);
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      q4_tile_mma<TA>(lut_l, wq, xa, xb, d);
      if (s.sub == 0) {
        acc0[0] = fmaf(d[0], sg, acc0[0]);
        acc0[1] = fmaf(d[1], sg, acc0[1]);
        acc0[2] = fmaf(d[2], sg8, acc0[2]);
        acc0[3] = fmaf(d[3], sg8, acc0[3]);
      } else {
        acc1[0] = fmaf(d[0], sg, acc1[0]);
        acc1[1] = fmaf(d[1], sg, acc1[1]);
        acc1[2] = fmaf(d[2], sg8, acc1[2]);
        acc1[3] = fmaf(d[3], sg8, acc1[3]);
      }
    }
    }
    if (BULK) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[slot]);
    } else {
      cur = nxt;
    }
    cs = stage_next(cs);
    const int64_t i = cs.i;
    const bool unit_done = s.kt + s.n == KT && s.sub == a.nsub - 1;
    if (!unit_done && i < end) continue;

    // ---- finish unit s.u: reduce over warps (and over blocks when it was cut) ----
    const int nv = a.nsub * 128;
    red[warp][g][2 * t] = acc0[0];
    red[warp][g][2 * t + 1] = acc0[1];
    red[warp][g + 8][2 * t] = acc0[2];
    red[warp][g + 8][2 * t + 1] = acc0[3];
    red[warp][16 + g][2 * t] = acc1[0];
    red[warp][16 + g][2 * t + 1] = acc1[1];
    red[warp][16 + g + 8][2 * t] = acc1[2];
    red[warp][16 + g + 8][2 * t + 1] = acc1[3];
#pragma unroll
    for (int q = 0; q < 4; ++q) acc0[q] = acc1[q] = 0.f;
    __syncthreads();
    float v = 0.f;
    if (tid < nv) {
#pragma unroll
      for (int w = 0; w < W; ++w) v += red[w][tid >> 3][tid & 7];
    }
    const int64_t u0 = s.u * UT, u1 = u0 + UT;
    const bool whole = u0 >= start && u1 <= end;
    bool finish = whole;
    if (!whole) {
      const int my_slot = u0 < start ? 0 : 1;
      if (tid < nv) a.partials[(b * 2 + my_slot) * 256 + tid] = v;
      __threadfence();
      __syncthreads();
      if (tid == 0) {
        const int contributors = int(block_of(u1 - 1) - block_of(u0) + 1);
        const int old = atomicAdd(a.counters + s.u, 1);
        s_last = old == contributors - 1;
        if (s_last) a.counters[s.u] = 0;
      }
      __syncthreads();
      finish = s_last;
      if (finish) {
        __threadfence();
        if (tid < nv) {
          // every contributor's partial in block order, this block's too: the sum must not depend
          // on which block arrived last (with three or more contributors it would otherwise)
          v = 0.f;
          for (int64_t bb = block_of(u0), bl = block_of(u1 - 1); bb <= bl; ++bb) {
            const int sl = u0 < start_of(bb) ? 0 : 1;
            v += __ldcg(a.partials + (bb * 2 + sl) * 256 + tid);
          }
        }
      }
    }
    if (finish) {
      if (tid < nv) vals[tid] = v;
      __syncthreads();
      if (tid < 128) {
        const int r = tid >> 3, n = tid & 7;
        int64_t rt0;
        const int k0 = seg_of(s.u, 0, rt0);
        const Q4StreamSeg& sg0 = a.seg[k0];
        const int64_t row = rt0 * 16 + r;
        if (n < a.T && row < sg0.rows) {
          const int64_t o = int64_t(n) * sg0.rows + row;
          if (a.ep == int(GemvEpilogue::SwiGLU)) {
            const Q4StreamSeg& up = a.seg[1];
            const float gv = to_f32<TA>(from_f32<TA>(vals[tid] + (sg0.bias ? sg0.bias[row] : 0.f)));
            const float uv = to_f32<TA>(from_f32<TA>(vals[128 + tid] + (up.bias ? up.bias[row] : 0.f)));
            q4_store_swiglu<TA>(sg0.out, o, gv, uv);
          } else {
            const float y = vals[tid] + (sg0.bias ? sg0.bias[row] : 0.f);
            q4_store_y<TA>(sg0.out, o, y, a.out_f32, a.ep == int(GemvEpilogue::Residual));
          }
        }
      }
    }
    __syncthreads();
  }
#endif
}

}  // namespace nf4flash::cuda
