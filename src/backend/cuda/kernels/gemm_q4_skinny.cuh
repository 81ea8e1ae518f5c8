// The skinny 4-bit GEMM: the batched decode step's linears, 9..64 rows of x against 4-bit weights
// (mma.sync, any sm_80+ GPU).
//
//   out_s[n, r] = sum_k x[n, k] * code[q_s(r, k)] * absmax_s(r, k) + bias_s[r],   n < T <= 64
//
// Same layout and arithmetic as the decode GEMV (gemv_q4_decode.cuh): weights in the tile16x64
// layout of gemv_q4.cuh (512 bytes of codes per 16 rows x 64 columns, absmax [RT][KT][16] f32 or
// u8 codes + nested f32 absmax for double quant), codes rounded to 16 bits through the per-lane
// byte table, each tile's mma partial sum scaled by its row's absmax in f32. x: [T, cols] bf16/f16;
// out_s: [T, rows_s] compute dtype or f32. Up to three weights sharing x in one launch (q, k, v;
// gate and up), each with its own output.
//
// Work: a "unit" is W x R consecutive row tiles of one weight (warp w owns row tiles w*R .. w*R+R-1
// of it), a "step" one 64-column tile of a unit. Every warp of a block works on the same step at
// once, so the block's 8 warps read the same x columns and x is fetched from L2 about once per
// block (L1 serves the other warps). The units x KT steps of the launch are cut into gridDim.x
// equal contiguous ranges (stream-K): block b takes steps [b*N/G, (b+1)*N/G), crossing unit
// boundaries, so every block does the same work whatever the shapes. Per step a warp decodes its R
// tiles once (16 table lookups each) and multiplies each against NT = ceil(T/8) token tiles of x
// (R * NT * 4 mma.m16n8k16); the x fragments of a step (NT x 32 bytes per lane, read from global
// memory through L1) serve all R tiles. Weights and absmax stream through a register ring D-1 steps
// ahead, across unit boundaries.
//
// A unit whose steps fall in one block's range is stored by that block. A unit cut between blocks
// first..last: each block stores its f32 accumulators to slot (unit + block) of the workspace (in
// register order: value i of thread tid at i * 256 + tid), then takes a ticket on the unit's
// counter; the last of them sums slots first..last in that order (the same sum whichever block
// comes last: deterministic), stores the unit and resets the counter to zero.
#pragma once
#include "backend/cuda/kernels/gemv_q4.cuh"

namespace nf4flash::cuda {

constexpr int kSkinnyW = 8;  // warps per block
constexpr int kSkinnyMaxSegs = 3;

struct Q4SkinnySeg {
  const uint8_t* tiles;
  const void* absmax;          // f32 [RT][KT][16], or u8 codes (double quant)
  const float* nested_absmax;  // double quant
  float offset;                // double quant
  const float* bias;           // [rows] or null
  void* out;                   // [T, rows]
  int64_t rows;
  int RT;
};

struct Q4SkinnyArgs {
  Q4SkinnySeg seg[kSkinnyMaxSegs];
  int unit_end[kSkinnyMaxSegs];  // cumulative units of segments 0..k
  float code[16];
  const float* nested_code;
  const void* x;  // [T, cols]
  int64_t cols;
  int KT, units, nseg, T, out_f32;
  int log2_blocksize, log2_nested;
  float* partial;  // (units + gridDim.x) slots of kSkinnyW * 32 * R * NT * 4 floats
  int* tickets;    // [units], zero between launches
};

// The block that owns step p of N steps cut into G ranges: the largest b with b*N/G <= p.
__device__ __forceinline__ int skinny_owner(int64_t p, int64_t N, int G) { return int(((p + 1) * G - 1) / N); }

// The lane's x fragments of column tile kt for token tiles n0 .. n0 + NTH - 1: 32 bytes each
// (columns 64 kt + 16 t .. + 15 of token 8 nt + g, clamped into T), through L1.
// xl: the lane's column 16 t of token 0; xo[nt]: the offset of token min(8 nt + g, T - 1)'s row.
template <typename TA, int NTH, int NT>
__device__ __forceinline__ void skinny_load_x(const TA* xl, const int (&xo)[NT], int n0, int kt, uint4 (&xa)[NTH],
                                              uint4 (&xb)[NTH]) {
#pragma unroll
  for (int nt = 0; nt < NTH; ++nt) {
    const uint4* xp = reinterpret_cast<const uint4*>(xl + xo[n0 + nt] + kt * 64);
    xa[nt] = __ldg(xp);
    xb[nt] = __ldg(xp + 1);
  }
}

// One row tile's step against NTH token tiles: the 4 mma of each token tile (A = the tile's code
// words fa[j], B = x words 2j, 2j + 1), the partial sums of rows g, g + 8 scaled by their absmax
// s0, s8 and added to acc (rows g, g + 8 x tokens 2t, 2t + 1 of each token tile).
template <typename TA, int NTH>
__device__ __forceinline__ void skinny_mma_tile(const uint32_t (&fa)[4][4], const uint4 (&xa)[NTH],
                                                const uint4 (&xb)[NTH], float s0, float s8, float (*acc)[4]) {
  float dd[NTH][4];
#pragma unroll
  for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dd[nt][e] = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int nt = 0; nt < NTH; ++nt) {
      const uint4& xv = j < 2 ? xa[nt] : xb[nt];
      const uint32_t b0 = (j & 1) ? xv.z : xv.x, b1 = (j & 1) ? xv.w : xv.y;
      mma_16816<TA>(dd[nt], fa[j], b0, b1);
    }
#pragma unroll
  for (int nt = 0; nt < NTH; ++nt) {
    acc[nt][0] = fmaf(dd[nt][0], s0, acc[nt][0]);
    acc[nt][1] = fmaf(dd[nt][1], s0, acc[nt][1]);
    acc[nt][2] = fmaf(dd[nt][2], s8, acc[nt][2]);
    acc[nt][3] = fmaf(dd[nt][3], s8, acc[nt][3]);
  }
}

template <typename TA, bool DQ, int NT, int R, int D>
__global__ void __launch_bounds__(kSkinnyW * 32, 1) gemm_q4_skinny_kernel(const __grid_constant__ Q4SkinnyArgs a) {
  constexpr int W = kSkinnyW, RS = R / 2, NACC = R * NT * 4, SLICE = NACC * W * 32;
  static_assert(R % 2 == 0, "gemm_q4_skinny: R even (lanes 0-15 and 16-31 hold the absmax of a pair of tiles)");
  extern __shared__ __align__(16) uint32_t lut[];  // [256][64]
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut));
  const uint32_t lane_b = 4u * lane;
  const int KT = a.KT, G = int(gridDim.x), b = int(blockIdx.x);
  const int64_t N = int64_t(a.units) * KT;
  const int64_t p0 = int64_t(b) * N / G, p1 = int64_t(b + 1) * N / G;
  pdl_trigger();
  if (p0 >= p1) return;  // block-uniform

  // segment of unit u and the unit's index inside it
  auto seg_of = [&](int u, int& ur) {
    int k = 0;
    while (k + 1 < a.nseg && u >= a.unit_end[k]) ++k;
    ur = u - (k ? a.unit_end[k - 1] : 0);
    return k;
  };

  // ---- load cursor: step (lu, lkt) and its tile pointers
  int lu = int(p0 / KT), lkt = int(p0 - int64_t(lu) * KT);
  int64_t lp = p0;
  const uint4* lw[R];   // this lane's 16 bytes of row tile r at column tile 0 (null: past RT)
  const uint8_t* la[RS];  // absmax of the lane's row (pair q: tile 2q + lane/16), column tile 0
  const float* lnest[RS];
  int64_t lrowc[RS];  // DQ: the lane's row * cols
  auto start_unit = [&]() {
    int ur;
    const Q4SkinnySeg& sg = a.seg[seg_of(lu, ur)];
    const int rt0 = ur * W * R + warp * R;
#pragma unroll
    for (int r = 0; r < R; ++r)
      lw[r] = rt0 + r < sg.RT ? reinterpret_cast<const uint4*>(sg.tiles) + int64_t(rt0 + r) * KT * 32 + lane : nullptr;
#pragma unroll
    for (int q = 0; q < RS; ++q) {
      const int rt = rt0 + 2 * q + (lane >> 4);
      la[q] = rt < sg.RT ? static_cast<const uint8_t*>(sg.absmax) + (int64_t(rt) * KT * 16 + (lane & 15)) * (DQ ? 1 : 4)
                         : nullptr;
      lnest[q] = sg.nested_absmax;
      lrowc[q] = min(int64_t(rt) * 16 + (lane & 15), sg.rows - 1) * a.cols;
    }
  };
  auto load = [&](uint4 (&wq)[R], float2 (&s)[RS]) {
#pragma unroll
    for (int r = 0; r < R; ++r) wq[r] = lw[r] ? ld_stream_u4(lw[r] + int64_t(lkt) * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int q = 0; q < RS; ++q) {
      if (!la[q]) {
        s[q] = make_float2(0.f, 0.f);  // scale 0: a tile past RT adds nothing
      } else if constexpr (DQ) {
        const int64_t blk = (lrowc[q] + int64_t(lkt) * 64) >> a.log2_blocksize;
        s[q] = make_float2(__int_as_float(__ldg(la[q] + int64_t(lkt) * 16)), __ldg(lnest[q] + (blk >> a.log2_nested)));
      } else {
        s[q] = make_float2(__ldg(reinterpret_cast<const float*>(la[q]) + int64_t(lkt) * 16), 0.f);
      }
    }
  };
  auto advance_load = [&]() {
    ++lp;
    if (++lkt == KT) {
      lkt = 0;
      ++lu;
      if (lp < p1) start_unit();
    }
  };

  uint4 wb[D][R];
  float2 sb[D][RS];
  start_unit();
#pragma unroll
  for (int d = 0; d < D - 1; ++d) {
    if (lp < p1) load(wb[d], sb[d]);
    if (lp < p1) advance_load();
  }
  // the tables while the first weights are in flight
  if (tid < 16) s_bits[tid] = bits16<TA>(a.code[tid]);
  if constexpr (DQ) s_nested_code[tid] = a.nested_code[tid];  // 256 threads
  __syncthreads();
  q4_fill_lut<64, W * 32>(lut, s_bits);
  __syncthreads();
  pdl_wait();

  // ---- compute cursor
  int cu = int(p0 / KT), ckt = int(p0 - int64_t(cu) * KT);
  int64_t cp = p0;
  int cur;
  int ck = seg_of(cu, cur);
  float offset = a.seg[ck].offset;
  // this lane's x rows: token 8 nt + g (clamped into T: those columns are never stored), columns 16 t ..
  // (T * cols < 2^31: the launcher checks)
  const TA* xl = static_cast<const TA*>(a.x) + 16 * t;
  int xo[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xo[nt] = min(8 * nt + g, a.T - 1) * int(a.cols);
  float acc[R][NT][4];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][nt][e] = 0.f;

  // The end of unit cu's steps in this block: store it, or hand the block's part to the workspace.
  auto finish_unit = [&]() {
    int ur;
    const Q4SkinnySeg& sg = a.seg[seg_of(cu, ur)];
    const int first = skinny_owner(int64_t(cu) * KT, N, G), last = skinny_owner(int64_t(cu) * KT + KT - 1, N, G);
    if (first != last) {
      float* slot = a.partial + (int64_t(cu) + b) * SLICE + tid;
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) __stcg(slot + ((r * NT + nt) * 4 + e) * (W * 32), acc[r][nt][e]);
      __threadfence();
      __syncthreads();
      if (tid == 0) s_last = atomicAdd(a.tickets + cu, 1) == last - first;
      __syncthreads();
      if (!s_last) return;
      __threadfence();
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[r][nt][e] = 0.f;
      for (int bb = first; bb <= last; ++bb) {
        const float* src = a.partial + (int64_t(cu) + bb) * SLICE + tid;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][nt][e] += __ldcg(src + ((r * NT + nt) * 4 + e) * (W * 32));
      }
      if (tid == 0) a.tickets[cu] = 0;  // every part has taken its ticket: ready for the next launch
    }
    const int rt0 = ur * W * R + warp * R;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t row = int64_t(rt0 + r) * 16 + g + (e >> 1) * 8;
          const int n = 8 * nt + 2 * t + (e & 1);
          if (row >= sg.rows || n >= a.T) continue;
          float y = acc[r][nt][e];
          if (sg.bias) y += sg.bias[row];
          if (a.out_f32) static_cast<float*>(sg.out)[n * sg.rows + row] = y;
          else static_cast<TA*>(sg.out)[n * sg.rows + row] = from_f32<TA>(y);
        }
  };

  for (bool more = true; more;) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      // keep D-1 steps in flight: load into the slot the previous step consumed
      if (lp < p1) {
        load(wb[(d + D - 1) % D], sb[(d + D - 1) % D]);
        advance_load();
      }
      float sv[RS];
#pragma unroll
      for (int q = 0; q < RS; ++q) {
        if constexpr (DQ) sv[q] = __fadd_rn(__fmul_rn(s_nested_code[__float_as_int(sb[d][q].x)], sb[d][q].y), offset);
        else sv[q] = sb[d][q].x;
      }
      float s0[R], s8[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        s0[r] = __shfl_sync(0xffffffffu, sv[r / 2], g + 16 * (r & 1));
        s8[r] = __shfl_sync(0xffffffffu, sv[r / 2], g + 8 + 16 * (r & 1));
      }
      if constexpr (NT <= 4) {
        // x fragments of column tile ckt (32 bytes per token tile), then per row tile: its 4 code
        // words through the table, each against every token tile
        uint4 xa[NT], xb[NT];
        skinny_load_x<TA, NT>(xl, xo, 0, ckt, xa, xb);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          uint32_t fa[4][4];
#pragma unroll
          for (int j = 0; j < 4; ++j) q4_word_lds(lut_s, lane_b, (&wb[d][r].x)[j], fa[j]);
          skinny_mma_tile<TA, NT>(fa, xa, xb, s0[r], s8[r], acc[r]);
        }
      } else {
        // 8 token tiles in two halves of 4 (x of one half in registers at a time); the codes go
        // through the table once, their words kept for both halves
        uint32_t fa[R][4][4];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < 4; ++j) q4_word_lds(lut_s, lane_b, (&wb[d][r].x)[j], fa[r][j]);
#pragma unroll
        for (int h = 0; h < NT / 4; ++h) {
          uint4 xa[4], xb[4];
          skinny_load_x<TA, 4>(xl, xo, 4 * h, ckt, xa, xb);
#pragma unroll
          for (int r = 0; r < R; ++r) skinny_mma_tile<TA, 4>(fa[r], xa, xb, s0[r], s8[r], &acc[r][4 * h]);
        }
      }
      ++cp;
      if (++ckt == KT || cp == p1) {  // block-uniform
        finish_unit();
        if (cp == p1) {
          more = false;
          break;
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][nt][e] = 0.f;
        ckt = 0;
        ++cu;
        ck = seg_of(cu, cur);
        offset = a.seg[ck].offset;
      }
    }
  }
}

}  // namespace nf4flash::cuda
