// Mixture-of-experts kernels of the CUDA backend: routing, the routed rows grouped by expert, the
// experts' products over those groups (4-bit tiled or dense weights, read by expert id from a
// device table, so a captured decode step serves whichever experts the router picks) and the
// weighted sum. T rows, E experts, K experts per row, P = T*K routed pairs; pair p = t*K + k.
//
//   moe_route_kernel    one block of min(T, 16) warps. logits [T, E] f32 -> per row t (a warp): the K
//                       largest p = softmax(logits[t]) (ties: the lower index), renormalized over
//                       the K when norm (summed in the order chosen), slots k sorted by expert:
//                       ids[p], wts[p]. Then the pairs grouped by expert: pair p goes to position q
//                       = pos_of[p] (row_of[q] = t), expert e's pairs at [first_e, first_e + n_e) in
//                       any order (a pair's arithmetic does not depend on its group), cut into
//                       chunks of <= 8 pairs: chunks[c] = (e, q0, n) for c < *n_chunks.
//   moe_gemv_kernel     one unit = (chunk c, row tile rt of 16 weight rows); block b takes units
//                       b, b + G, ... of n_chunks * RT. For the chunk's pairs q = q0 .. q0+n-1:
//                         SwiGLU: out[q, r] = silu(round(x[row_of[q]] . gate_e[r])) * round(x[row_of[q]] . up_e[r])
//                         Store:  out[q, r] = round(x[q] . W_e[r])
//                       rounded to the compute dtype; f32 accumulation. Warp w takes the 64-column
//                       tiles kt = w, w + 8, ...; lane 4g + t the rows g, g + 8 and columns
//                       64 kt + 16 t .. + 15: the 16 bytes the tile16x64 layout (gemv_q4.cuh) gives
//                       that lane (one coalesced 512-byte load per warp and tile), codes through a
//                       16-entry table in shared memory, the absmax scaling each tile's partial
//                       sum (bitsandbytes' double-quant decode). Dense weights ([rows, cols] in the
//                       compute dtype) are read over the same (row, column) split. Sums reduced over
//                       a row's 4 lanes (shuffles), then over the warps in shared memory. The
//                       chunk form (CH = 8) decodes a tile once for all its pairs, one tile a warp
//                       in flight; the one-row form (CH = 1: a decode step's SwiGLU, 4-bit at
//                       bf16/f16; its down products: moe_down_combine.cuh) keeps four tiles a warp in flight and multiplies each on the tensor cores
//                       as the decode GEMV does: its code words through the per-lane byte table
//                       (gemv_q4.cuh, [256][64] words = 64 KB of dynamic shared memory) into
//                       mma.m16n8k16 against x (the row staged in shared memory after the table,
//                       cols <= kMoeOneRowMaxCols), codes rounded to the compute dtype. With logits
//                       (a decode step of <= 128 experts) each block of the one-row form routes
//                       the row itself (moe_select_row, moe_route_kernel's arithmetic) and block 0
//                       stores ids and wts for the down products: no routing launch.
//   moe_combine_kernel  out[t, c] = round(sum_k wts[t*K+k] * y[pos_of[t*K+k], c]
//                                         (+ sigmoid(shared_logit[t]) * shared[t, c])), f32 sums,
//                       slots in ascending expert order (residual: out += that, rounded first).
//                       Grid (ceil(cols / 256), T). A decode step (one row, 4-bit at bf16/f16)
//                       sums in moe_down_combine_kernel instead.
#pragma once
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/moe_launchers.h"

namespace nf4flash::cuda {

constexpr int kMoeWarps = 8, kMoeRouteWarps = 16;
// Experts a lane holds where the one-row moe_gemv_kernel routes its row itself (E <= 128: four).
constexpr int kMoeFoldLanes = kMoeFoldMaxExperts / 32;

// One warp routes one row: logits l [E] f32 -> the K largest p = softmax(l) (ties: the lower
// index), renormalized over the K when norm (summed in the order chosen), handed to slot(k, e, w)
// by ascending expert e (slot k = the number of chosen experts below e); the lane holding e calls it.
// LE: experts a lane holds (expert lane + 32 i, i < LE), E <= 32 LE; a larger LE than E needs adds
// only zeros and unselectable keys, so every LE that covers E routes alike.
template <int LE, typename Slot>
__device__ __forceinline__ void moe_select_row(const float* l, int E, int K, int norm_topk, Slot&& slot) {
  static_assert(LE >= 1 && LE <= 32, "moe_select_row: a lane's chosen-expert mask is 32 bits");
  const int lane = threadIdx.x & 31;
  float v[LE];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < LE; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < E ? l[e] : -INFINITY;
    mx = fmaxf(mx, v[i]);
  }
  mx = warp_max(mx);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < LE; ++i) {
    v[i] = lane + 32 * i < E ? expf(v[i] - mx) : 0.f;
    s += v[i];
  }
  s = warp_sum(s);
#pragma unroll
  for (int i = 0; i < LE; ++i) v[i] = lane + 32 * i < E ? v[i] / s : -1.f;
  // Selection keys: p's bits + 1 (p >= 0 orders as unsigned), 0 = not selectable (e >= E, NaN,
  // chosen). A round takes the largest key (warp max) and, among its holders, the lowest expert
  // (warp min); with no key left (NaN logits) the lowest expert not chosen yet, p = 0.
  uint32_t chosen = 0;  // bit i: expert lane + 32 i is selected, its p in v[i]
  float norm = 0.f;
  for (int k = 0; k < K; ++k) {
    uint32_t bk = 0;
    int bi = 0;
#pragma unroll
    for (int i = 0; i < LE; ++i) {
      const uint32_t key = !((chosen >> i) & 1u) && v[i] >= 0.f ? __float_as_uint(v[i]) + 1u : 0u;
      if (key > bk) {  // ascending e within the lane: the first of equal keys wins
        bk = key;
        bi = i;
      }
    }
    const uint32_t m = __reduce_max_sync(0xffffffffu, bk);
    uint32_t cand = bk == m ? uint32_t(lane + 32 * bi) : 0xffffffffu;
    if (!m) {  // warp-uniform: no key left, the lane's lowest expert not chosen yet
      cand = 0xffffffffu;
#pragma unroll
      for (int i = LE - 1; i >= 0; --i)
        if (!((chosen >> i) & 1u) && lane + 32 * i < E) cand = uint32_t(lane + 32 * i);
    }
    const int be = int(__reduce_min_sync(0xffffffffu, cand));
    const float bp = m ? __uint_as_float(m - 1u) : 0.f;
    norm += bp;
#pragma unroll
    for (int i = 0; i < LE; ++i)
      if (lane + 32 * i == be) {
        v[i] = bp;
        chosen |= 1u << i;
      }
  }
  if (!norm_topk) norm = 1.f;
  const uint32_t below_lane = (1u << lane) - 1u;
  int before = 0;
#pragma unroll
  for (int i = 0; i < LE; ++i) {
    const bool mine = (chosen >> i) & 1u;
    const uint32_t mk = __ballot_sync(0xffffffffu, mine);
    if (mine) slot(before + __popc(mk & below_lane), lane + 32 * i, v[i] / norm);
    before += __popc(mk);
  }
}

// LE: experts a lane holds (expert lane + 32 i, i < LE): E <= 32 LE. The launcher takes the
// smallest of 1, 4, 8, 16 that covers E, so the per-lane loops of each selection round and of the
// grouping run over no more slots than the experts need.
template <int LE>
__global__ void __launch_bounds__(kMoeRouteWarps * 32) moe_route_kernel(const MoeRouteArgs a) {
  __shared__ int cnt[kMoeMaxExperts], first[kMoeMaxExperts], cur[kMoeMaxExperts], cbase[kMoeMaxExperts];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, E = a.E, K = a.K;
  pdl_trigger();
  for (int e = tid; e < E; e += blockDim.x) cnt[e] = cur[e] = 0;
  pdl_wait();  // the router's logits; the previous step's readers of the routing arrays are done
  __syncthreads();
  for (int t = warp; t < a.T; t += blockDim.x / 32)
    moe_select_row<LE>(a.logits + int64_t(t) * E, E, K, a.norm, [&](int k, int e, float w) {
      a.ids[t * K + k] = e;
      a.wts[t * K + k] = w;
      atomicAdd(&cnt[e], 1);
    });
  __syncthreads();
  if (warp == 0) {  // exclusive prefix sums of the pairs and chunks per expert: lane l owns experts
    // [l * LE, (l + 1) * LE)
    const int e0 = lane * LE;
    int q = 0, c = 0;
    for (int i = 0; i < LE && e0 + i < E; ++i) {
      q += cnt[e0 + i];
      c += (cnt[e0 + i] + kMoeChunk - 1) / kMoeChunk;
    }
    int qs = q, cs = c;  // inclusive scans over the lanes
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int qn = __shfl_up_sync(0xffffffffu, qs, o), cn = __shfl_up_sync(0xffffffffu, cs, o);
      if (lane >= o) {
        qs += qn;
        cs += cn;
      }
    }
    q = qs - q;
    c = cs - c;
    for (int i = 0; i < LE && e0 + i < E; ++i) {
      first[e0 + i] = q;
      cbase[e0 + i] = c;
      q += cnt[e0 + i];
      c += (cnt[e0 + i] + kMoeChunk - 1) / kMoeChunk;
    }
    if (lane == 31) *a.n_chunks = cs;
  }
  __syncthreads();
  const int P = a.T * K;
  for (int p = tid; p < P; p += blockDim.x) {
    const int e = a.ids[p];
    const int q = first[e] + atomicAdd(&cur[e], 1);
    a.pos_of[p] = q;
    a.row_of[q] = p / K;
  }
  for (int e = tid; e < E; e += blockDim.x)
    for (int c = 0; c * kMoeChunk < cnt[e]; ++c) {
      int* ch = a.chunks + 3 * (cbase[e] + c);
      ch[0] = e;
      ch[1] = first[e] + c * kMoeChunk;
      ch[2] = min(kMoeChunk, cnt[e] - c * kMoeChunk);
    }
}

// 16 consecutive values at p as f32 (16-byte aligned when vec).
template <typename T>
__device__ __forceinline__ void moe_load16(const T* p, bool vec, int valid, float* out) {
  if (vec) {
    constexpr int E = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < 16 / E; ++i) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
      const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int k = 0; k < E; ++k) out[i * E + k] = to_f32<T>(h[k]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) out[i] = i < valid ? to_f32<T>(p[i]) : 0.f;
  }
}

// A lane's share of one 4-bit tile (its 16 code bytes) and the raw absmax of rows g, g + 8 (f32, or
// the u8 code's bits and the nested absmax for double quant): loaded a tile ahead of its decode.
struct MoeRaw {
  uint4 wq;
  float2 s[2];
};
template <MoeKind WK>
__device__ __forceinline__ MoeRaw moe_tile_load(const MoeMatArgs& m, const MoeExpertW& x, int64_t rt, int64_t kt) {
  const int lane = threadIdx.x & 31, g = lane >> 2;
  MoeRaw raw;
  raw.wq = ld_stream_u4(static_cast<const uint8_t*>(x.w) + ((rt * m.KT + kt) * 32 + lane) * 16);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    const int64_t i = (rt * m.KT + kt) * 16 + r;
    if constexpr (WK == MoeKind::Q4) {
      raw.s[h] = make_float2(__ldg(static_cast<const float*>(x.absmax) + i), 0.f);
    } else {
      int64_t row = rt * 16 + r;
      row = row < m.rows ? row : m.rows - 1;
      const int64_t blk = (row * m.cols + kt * 64) >> m.log2_blocksize;
      raw.s[h] = make_float2(__int_as_float(int(__ldg(static_cast<const uint8_t*>(x.absmax) + i))),
                             __ldg(x.nested_absmax + (blk >> m.log2_nested)));
    }
  }
  return raw;
}

// The lane's weights as f32: w[0][i] row g, w[1][i] row g + 8, columns 64 kt + 16 t + i;
// scale[0..1]: their absmax (bitsandbytes' double-quant decode: product rounded, then the offset).
template <MoeKind WK>
__device__ __forceinline__ void moe_tile_decode(const MoeRaw& raw, float offset, const float* s_code,
                                                const float* s_nested, float (&w)[2][16], float (&scale)[2]) {
  const uint32_t words[4] = {raw.wq.x, raw.wq.y, raw.wq.z, raw.wq.w};
  // word j: bytes (row g, c), (row g+8, c), (row g, c+1), (row g+8, c+1), source byte c = 8t + 2j
  // of the row in this tile; high nibble = the even column
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t b0 = (words[j] >> (8 * h)) & 0xffu, b1 = (words[j] >> (8 * (h + 2))) & 0xffu;
      w[h][4 * j + 0] = s_code[b0 >> 4];
      w[h][4 * j + 1] = s_code[b0 & 15];
      w[h][4 * j + 2] = s_code[b1 >> 4];
      w[h][4 * j + 3] = s_code[b1 & 15];
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) scale[h] = q4_scale_decode<WK == MoeKind::Q4DoubleQuant>(raw.s[h], offset, s_nested);
}

// Dense weights: the lane's rows g, g + 8 of row tile rt, columns 64 kt + 16 t .. + 15 (zero past
// the matrix), scale 1.
template <typename TA>
__device__ __forceinline__ void moe_dense_weights(const MoeMatArgs& m, const MoeExpertW& x, int64_t rt, int64_t kt,
                                                  float (&w)[2][16], float (&scale)[2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t c0 = kt * 64 + 16 * t;
  const int valid = int(m.cols - c0 < 16 ? m.cols - c0 : 16);
  const bool vec = (m.cols & 63) == 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = rt * 16 + g + 8 * h;
    if (row < m.rows && valid > 0) {
      moe_load16<TA>(static_cast<const TA*>(x.w) + row * m.cols + c0, vec, valid, w[h]);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) w[h][i] = 0.f;
    }
    scale[h] = 1.f;
  }
}

// acc[j][h] += scale[h] * (w[h] . x of pair j) over this lane's 16 columns of tile kt, j < n.
template <typename TA, int CH>
__device__ __forceinline__ void moe_tile_dot(const void* x, const int32_t* xrows, int n, int64_t cols, int64_t kt,
                                             const float (&w)[2][16], const float (&scale)[2], float (&acc)[CH][2]) {
  const int t = threadIdx.x & 3;
  const int64_t c0 = kt * 64 + 16 * t;
  const int valid = int(cols - c0 < 16 ? cols - c0 : 16);
  if (valid <= 0) return;
  const bool vec = (cols & 63) == 0;
#pragma unroll
  for (int j = 0; j < CH; ++j) {
    if (j < n) {
      float xv[16];
      moe_load16<TA>(static_cast<const TA*>(x) + int64_t(xrows[j]) * cols + c0, vec, valid, xv);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < 16; ++i) d = fmaf(w[h][i], xv[i], d);
        acc[j][h] = fmaf(d, scale[h], acc[j][h]);
      }
    }
  }
}

// The lane's 16 x values of tile kt (columns 64 kt + 16 t .. + 15 of row xrow) as two 16-byte words.
template <typename TA>
__device__ __forceinline__ void moe_x16(const TA* x, int32_t xrow, int64_t cols, int64_t kt, uint4& xa, uint4& xb) {
  const uint4* xp = reinterpret_cast<const uint4*>(x + int64_t(xrow) * cols + kt * 64 + 16 * (threadIdx.x & 3));
  xa = __ldg(xp);
  xb = __ldg(xp + 1);
}

// One pair (a decode step's row), 4-bit weights at bf16/f16: the lane's 4 code words through the
// per-lane byte table (two codes a load) into one mma.m16n8k16 each against x's 16 columns
// 64 kt + 16 t .. + 15 in xa, xb (every lane holds the pair's x, so the 8 mma columns are alike),
// the tile's sums of rows g, g + 8 (summed over the 64 columns in the mma) scaled by their absmax
// into acc[0][0], acc[0][1]. The codes enter the mma rounded to the compute dtype, as in the decode GEMV.
template <typename TA, MoeKind WK>
__device__ __forceinline__ void moe_tile_mma1(const MoeRaw& raw, float offset, uint32_t lut_s, uint32_t lane_b,
                                              const float* s_nested, const uint4& xa, const uint4& xb,
                                              float (&acc)[1][2]) {
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  q4_tile_mma_prmt<TA>(lut_s, lane_b, raw.wq, xa, xb, d);
  constexpr bool DQ = WK == MoeKind::Q4DoubleQuant;
  acc[0][0] = fmaf(d[0], q4_scale_decode<DQ>(raw.s[0], offset, s_nested), acc[0][0]);
  acc[0][1] = fmaf(d[2], q4_scale_decode<DQ>(raw.s[1], offset, s_nested), acc[0][1]);
}

// The 4 lanes of each row summed (shuffles), then written to red[warp][row][pair]; acc zeroed. CH = 1
// (moe_tile_mma1): each lane already holds its rows' sums over the tile, lane t = 0 writes them.
template <int CH>
__device__ __forceinline__ void moe_publish(float (&red)[kMoeWarps][16][CH], float (&acc)[CH][2]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  if constexpr (CH == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (t == 0) red[warp][g + 8 * h][0] = acc[0][h];
      acc[0][h] = 0.f;
    }
  } else {
#pragma unroll
    for (int j = 0; j < CH; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v = acc[j][h];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (t == 0) red[warp][g + 8 * h][j] = v;
        acc[j][h] = 0.f;
      }
  }
}

// CH: the most pairs a chunk holds for this launch (1 when every row picks an expert once and
// there is one row, a decode step; else kMoeChunk). B: 4-bit tiles a warp has in flight per matrix
// (its loads issued before the first of them is decoded). a.wpu warps take one unit together (the
// block holds 8 / wpu units at a time; wpu < 8 only with CH = 1): few tiles per row, as a decode
// step's down products have, need more units in flight rather than more warps per unit.
template <typename TA, MoeKind WK, bool SWIGLU, int CH>
__global__ void __launch_bounds__(kMoeWarps * 32, 2) moe_gemv_kernel(const __grid_constant__ MoeGemvArgs a) {
  static_assert(CH != 1 || (WK != MoeKind::Dense && sizeof(TA) == 2 && SWIGLU),
                "the one-row form: gate and up of 4-bit experts at bf16/f16");
  constexpr int B = CH == 1 ? 4 : 1;
  // CH = 1: [256][64] byte -> two codes (q4_fill_lut), then the x row (cols values)
  extern __shared__ __align__(16) uint32_t lut[];
  uint4* const s_x = reinterpret_cast<uint4*>(lut + kQ4LutBytes / 4);
  __shared__ float red[SWIGLU ? 2 : 1][kMoeWarps][16][CH];
  __shared__ float s_code[16];
  __shared__ uint32_t s_bits[16];
  __shared__ float s_nested[256];
  __shared__ int32_t s_rows[kMoeWarps][CH];
  __shared__ int32_t s_ids[kMoeMaxTopK];  // CH = 1: the chosen experts, ascending
  const int tid = threadIdx.x, warp = tid >> 5, wpu = a.wpu, G = kMoeWarps / wpu;
  const int grp = warp / wpu, gw = warp - grp * wpu;  // the warp's unit in the block, its rank there
  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut)), lane_b = 4u * (tid & 31);
  pdl_trigger();
  const MoeMatArgs& m0 = a.m[0];
  if (tid < 16) s_code[tid] = m0.code[tid];
  if constexpr (WK == MoeKind::Q4DoubleQuant)
    for (int i = tid; i < 256; i += blockDim.x) s_nested[i] = m0.nested_code[i];
  if constexpr (CH == 1) {  // the byte table (the unit loop's first barrier orders it before use)
    if (tid < 16) s_bits[tid] = bits16<TA>(m0.code[tid]);
    __syncthreads();
    q4_fill_lut<64, kMoeWarps * 32>(lut, s_bits);
  }
  const int64_t RT = m0.RT, KT = m0.KT, rows = m0.rows, cols = m0.cols;
  pdl_wait();  // the routing (chunks, row_of) or the router's logits, and x
  // CH = 1 (one row): chunk c is the c-th chosen expert's one pair, at position c; a.one_row_chunks = K
  if constexpr (CH == 1) {  // the unit loop's first barrier orders s_x and s_ids before use
    for (int64_t i = tid; i < cols / 8; i += blockDim.x) s_x[i] = __ldg(static_cast<const uint4*>(a.x) + i);
    if (a.logits) {         // the block routes the row itself; block 0 stores ids and wts
      if (warp == 0)
        moe_select_row<kMoeFoldLanes>(a.logits, a.E, a.one_row_chunks, a.norm, [&](int k, int e, float w) {
          s_ids[k] = e;
          if (blockIdx.x == 0) {
            a.ids[k] = e;
            a.wts[k] = w;
          }
        });
    } else if (tid < a.one_row_chunks) {
      s_ids[tid] = a.chunks[3 * tid];
    }
  }
  const int64_t units = int64_t(CH == 1 ? a.one_row_chunks : *a.n_chunks) * RT;
  float acc[2][CH][2] = {};
  // every warp runs the same iterations (the barriers); a group past the last unit idles
  for (int64_t u0 = int64_t(blockIdx.x) * G; u0 < units; u0 += int64_t(gridDim.x) * G) {
    const int64_t u = u0 + grp;
    const bool live = u < units;
    const int64_t c = live ? u / RT : 0, rt = live ? u - c * RT : 0;
    int e = 0, n = 0;
    int32_t xrows[CH];
    __syncthreads();  // s_code, s_nested, s_ids (and the table) written; the previous unit's s_rows and red read
    if constexpr (CH == 1) {  // gate and up of the one row: x row 0
      e = live ? s_ids[c] : 0;
      n = live ? 1 : 0;
      xrows[0] = 0;
    } else {
      e = live ? a.chunks[3 * c] : 0;
      const int q0 = live ? a.chunks[3 * c + 1] : 0;
      n = live ? min(a.chunks[3 * c + 2], CH) : 0;
      if (gw == 0 && (tid & 31) < CH) {
        const int j = tid & 31;
        s_rows[grp][j] = j < n ? (a.row_of ? a.row_of[q0 + j] : q0 + j) : 0;
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < CH; ++j) xrows[j] = s_rows[grp][j];
    }
    if (live) {
      const MoeExpertW x0 = a.m[0].experts[e];
      MoeExpertW x1{};
      if constexpr (SWIGLU) x1 = a.m[1].experts[e];
      for (int64_t kt0 = gw; kt0 < KT; kt0 += int64_t(wpu) * B) {
        if constexpr (WK == MoeKind::Dense) {
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const int64_t kt = kt0 + int64_t(wpu) * b;
            if (kt >= KT) break;
            float w[2][16], sc[2];
            moe_dense_weights<TA>(a.m[0], x0, rt, kt, w, sc);
            moe_tile_dot<TA, CH>(a.x, xrows, n, cols, kt, w, sc, acc[0]);
            if constexpr (SWIGLU) {
              moe_dense_weights<TA>(a.m[1], x1, rt, kt, w, sc);
              moe_tile_dot<TA, CH>(a.x, xrows, n, cols, kt, w, sc, acc[1]);
            }
          }
        } else {
          MoeRaw r0[B], r1[B];  // every load of the batch out before the first decode
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const int64_t kt = kt0 + int64_t(wpu) * b;
            if (kt < KT) {
              r0[b] = moe_tile_load<WK>(a.m[0], x0, rt, kt);
              if constexpr (SWIGLU) r1[b] = moe_tile_load<WK>(a.m[1], x1, rt, kt);
            }
          }
#pragma unroll
          for (int b = 0; b < B; ++b) {
            const int64_t kt = kt0 + int64_t(wpu) * b;
            if (kt >= KT) break;
            if constexpr (CH == 1) {  // x of the tile from shared memory, once for gate and up
              const uint4* xp = s_x + (kt * 64 + 16 * (tid & 3)) / 8;
              const uint4 xa = xp[0], xb = xp[1];
              moe_tile_mma1<TA, WK>(r0[b], x0.offset, lut_s, lane_b, s_nested, xa, xb, acc[0]);
              moe_tile_mma1<TA, WK>(r1[b], x1.offset, lut_s, lane_b, s_nested, xa, xb, acc[1]);
            } else {
              float w[2][16], sc[2];
              moe_tile_decode<WK>(r0[b], x0.offset, s_code, s_nested, w, sc);
              moe_tile_dot<TA, CH>(a.x, xrows, n, cols, kt, w, sc, acc[0]);
              if constexpr (SWIGLU) {
                moe_tile_decode<WK>(r1[b], x1.offset, s_code, s_nested, w, sc);
                moe_tile_dot<TA, CH>(a.x, xrows, n, cols, kt, w, sc, acc[1]);
              }
            }
          }
        }
      }
    }
    moe_publish<CH>(red[0], acc[0]);
    if constexpr (SWIGLU) moe_publish<CH>(red[1], acc[1]);
    __syncthreads();
    // outputs: (unit group, row, pair) = tid / (16 CH), (tid / CH) % 16, tid % CH
    if (tid < 16 * CH * G) {
      const int og = tid / (16 * CH), r = (tid / CH) % 16, j = tid % CH;
      const int64_t uo = u0 + og, co = uo / RT, row = (uo - co * RT) * 16 + r;
      const int no = uo < units ? (CH == 1 ? 1 : min(a.chunks[3 * co + 2], CH)) : 0;
      if (j < no && row < rows) {
        const int qo = CH == 1 ? int(co) : a.chunks[3 * co + 1];
        float y = 0.f;
        for (int w = og * wpu; w < (og + 1) * wpu; ++w) y += red[0][w][r][j];
        TA* out = static_cast<TA*>(a.out) + int64_t(qo + j) * rows + row;
        if constexpr (SWIGLU) {
          float up = 0.f;
          for (int w = og * wpu; w < (og + 1) * wpu; ++w) up += red[1][w][r][j];
          const float gv = to_f32<TA>(from_f32<TA>(y)), uv = to_f32<TA>(from_f32<TA>(up));
          *out = from_f32<TA>(gv / (1.f + __expf(-gv)) * uv);
        } else {
          *out = from_f32<TA>(y);
        }
      }
    }
  }
}

// s + sigmoid(logit) * shared: a shared expert's output (Qwen2-MoE) added to the weighted sum.
template <typename TA>
__device__ __forceinline__ float moe_add_shared(float s, float logit, TA shared) {
  return fmaf(1.f / (1.f + expf(-logit)), to_f32<TA>(shared), s);
}

template <typename TA>
__global__ void moe_combine_kernel(const MoeCombineArgs a) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, t = blockIdx.y;
  pdl_trigger();
  pdl_wait();
  if (c >= a.cols) return;
  float s = 0.f;
  for (int k = 0; k < a.K; ++k) {
    const int64_t p = t * a.K + k;
    s = fmaf(a.wts[p], to_f32<TA>(static_cast<const TA*>(a.y)[int64_t(a.pos_of[p]) * a.cols + c]), s);
  }
  if (a.shared) s = moe_add_shared(s, a.shared_logit[t], static_cast<const TA*>(a.shared)[t * a.cols + c]);
  q4_store_y<TA>(a.out, t * a.cols + c, s, 0, a.residual);  // rounded; residual: added as add() adds
}

}  // namespace nf4flash::cuda
