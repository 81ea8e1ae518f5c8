// Causal attention of q [T, n_heads*hd] over the KV cache of one layer (K, V each
// [n_kv][capacity][hd]): query row t (absolute position pos0+t) sees cache positions [0, pos0+t].
// GQA: q head h reads kv head h / (n_heads/n_kv); K/V are never repeated in memory.
// Softmax in the log2 domain (q pre-scaled by scale*log2(e)), f32 throughout.
//
// attn_decode_kernel (flash-decoding on CUDA cores, T <= 4; the default; the opt-in tensor-core
// attn_decode_mma_kernel is in attention_decode_mma.cuh): grid (n_kv * head_chunks, nsplit, T), 128 threads.
//   A block takes up to 4 q heads sharing one kv head and a contiguous slice of the sequence; the
//   slice length is max(64, ceil(L/nsplit)) with L = pos0+t+1 read on the device, so a captured
//   graph stays valid as the context grows (idle splits exit at once); with
//   NF4FLASH_DECODE_ORDER=interleave the active splits take the context's block steps round robin
//   instead (decode_span). HD/8 lanes hold one position
//   (16-byte loads of K and V rows), a warp covers 32/(HD/8) positions per step, two steps per
//   iteration. RING > 0: each thread's K/V bytes of an iteration go through its own ring of RING
//   slots in shared memory (cp.async; [RING][2][K|V][chunk][128 threads] x 16 bytes, 32 KB for
//   bf16 at RING 4, f32 caches use 2 slots), so RING-1 iterations are in flight while one is
//   summed; RING = 0 loads into registers and waits at once (one iteration in flight). Same
//   positions per thread in the same order either way: the results are identical. Partials (m, l, acc[hd]) go to the
//   workspace; attn_combine_kernel merges the splits per (t, head) in a second launch (default), or,
//   with counters (NF4FLASH_ATTN_COMBINE=fused, measured slower), the last block of each (t, head
//   group) to finish merges the group's splits with the same arithmetic (counter per group, reset
//   by that block). FUSED = true (attention_decode_rope, opt-in NF4FLASH_DECODE_FUSED=1; T = 1):
//   rope and the cache write in the same launch, the splits merged in a thread-block cluster or by
//   the last block (see the comment at the kernel).
// attn_prefill_kernel (any T; the memory-efficient path without tensor cores, "sdpa"):
//   grid (ceil(T/16), n_heads), 128 threads; 16 query rows per block, 4 per warp; K/V tiles of 32
//   positions staged in shared memory as f32 (rows padded by one word: conflict-free); online softmax.
#pragma once
#include <cooperative_groups.h>

#include <cmath>
#include <cstring>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels/cp_async.cuh"
#include "backend/cuda/kernels/elementwise.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Eight consecutive cache values kept raw (16-byte load; two for f32) until they are used.
template <typename T> struct Raw8 { uint4 v; };
template <> struct Raw8<float> { float4 a, b; };
template <typename T>
__device__ __forceinline__ Raw8<T> load_raw8(const T* p) {
  Raw8<T> r;
  if constexpr (sizeof(T) == 2) {
    r.v = *reinterpret_cast<const uint4*>(p);
  } else {
    r.a = *reinterpret_cast<const float4*>(p);
    r.b = *reinterpret_cast<const float4*>(p + 4);
  }
  return r;
}
// The same eight values from their 16-byte copies (the decode kernel's shared-memory ring).
template <typename T>
__device__ __forceinline__ Raw8<T> raw8_from_u4(const uint4* c) {
  Raw8<T> r;
  if constexpr (sizeof(T) == 2) {
    r.v = c[0];
  } else {
    r.a = make_float4(__uint_as_float(c[0].x), __uint_as_float(c[0].y), __uint_as_float(c[0].z), __uint_as_float(c[0].w));
    r.b = make_float4(__uint_as_float(c[1].x), __uint_as_float(c[1].y), __uint_as_float(c[1].z), __uint_as_float(c[1].w));
  }
  return r;
}
template <typename T>
__device__ __forceinline__ void unpack_raw8(const Raw8<T>& r, float* f) {
  if constexpr (sizeof(T) == 2) {
    unpack8<T>(r.v, f);
  } else {
    f[0] = r.a.x; f[1] = r.a.y; f[2] = r.a.z; f[3] = r.a.w; f[4] = r.b.x; f[5] = r.b.y; f[6] = r.b.z; f[7] = r.b.w;
  }
}

// Sequence slice of one decode split: at least min_chunk positions (AttnArgs::dec_min_chunk), so
// short contexts use few splits (the combine reads only the active ones).
__host__ __device__ __forceinline__ int decode_chunk(int L, int nsplit, int min_chunk) {
  const int c = (L + nsplit - 1) / nsplit;
  return c < min_chunk ? min_chunk : c;
}
// The splits with positions at context length L (slices of `chunk`): what every merge reads.
__host__ __device__ __forceinline__ int decode_nact(int L, int nsplit, int chunk) {
  const int n = (L + chunk - 1) / chunk;
  return n < nsplit ? n : nsplit;
}

// The work of one decode block: q heads h0 .. h0+nh-1 (at most `per_block`, all of kv head kvh) of
// token t over the cache slice [s0, s1) of split `split` (slices of `chunk` positions); active =
// s0 < L (idle splits exit), i.e. split < nact, the active splits (what the merge reads).
struct DecodeBlock {
  int kvh, h0, nh, t, split, L, chunk, s0, s1, nact;
  __device__ bool active() const { return s0 < L; }
};
__device__ __forceinline__ DecodeBlock decode_block(const AttnArgs& a, int nsplit, int hchunks, int per_block) {
  DecodeBlock b;
  const int hc = blockIdx.x % hchunks, G = a.n_heads / a.n_kv;
  b.kvh = blockIdx.x / hchunks;
  b.h0 = b.kvh * G + hc * per_block;
  b.nh = min(per_block, G - hc * per_block);
  b.t = blockIdx.z, b.split = blockIdx.y;
  b.L = a.pos0[0] + b.t + 1;
  b.chunk = decode_chunk(b.L, nsplit, a.dec_min_chunk);
  b.s0 = b.split * b.chunk, b.s1 = min(b.L, b.s0 + b.chunk);
  b.nact = decode_nact(b.L, nsplit, b.chunk);
  return b;
}

// The positions an active decode block walks, in block steps of `step` positions (what one
// iteration of the block's warps covers): step j covers [base + j*stride, + step), positions < end.
//   contiguous (default): the split's slice in order: base s0, stride step, end s1;
//   interleaved (AttnArgs::dec_interleave, NF4FLASH_DECODE_ORDER=interleave): the nact active
//     splits take the steps of the whole context round robin (split s: steps s, s + nact, ...):
//     base s*step, stride nact*step, end L. At any moment the splits of a kv head then read
//     neighbouring pieces of its cache (one window moving through it) instead of nact streams a
//     slice apart. The same positions are summed and merged; each split's set and order change.
//     A split may get no step (step > chunk): its partial is empty (m = -inf, l = 0), which the
//     merges weigh 0.
struct DecodeSpan {
  int base, stride, end;
  // steps whose first position for this thread (offset `off` into the step) is < end
  __device__ int steps(int off) const { return base + off < end ? (end - base - off + stride - 1) / stride : 0; }
};
__device__ __forceinline__ DecodeSpan decode_span(const AttnArgs& a, const DecodeBlock& b, int step) {
  if (a.dec_interleave) return DecodeSpan{b.split * step, b.nact * step, b.L};
  return DecodeSpan{b.s0, step, b.s1};
}

// Merge online-softmax state (m2, l2, acc2) into (m, l, acc).
__device__ __forceinline__ void softmax_merge(float& m, float& l, float* acc, float m2, float l2, const float* acc2, int n) {
  const float M = fmaxf(m, m2);
  const float c1 = (m == -INFINITY) ? 0.f : exp2f(m - M);
  const float c2 = (m2 == -INFINITY) ? 0.f : exp2f(m2 - M);
  l = l * c1 + l2 * c2;
  for (int i = 0; i < n; ++i) acc[i] = acc[i] * c1 + acc2[i] * c2;
  m = M;
}

// The split weights of one (token, head) from the splits' (m, l), one warp, lane-strided: s_c[s] =
// 2^(m_s - M) and the returned 1 / sum_s s_c[s] l_s (valid in every lane). get_m / get_l read split
// s's state (the workspace, or another block's shared memory in the fused kernel's cluster).
template <typename GetM, typename GetL>
__device__ __forceinline__ float merge_weights(int lane, int nact, GetM get_m, GetL get_l, float* s_c) {
  float M = -INFINITY;
  for (int s = lane; s < nact; s += 32) M = fmaxf(M, get_m(s));
  M = warp_max(M);
  float lsum = 0.f;
  for (int s = lane; s < nact; s += 32) {
    const float ms = get_m(s);
    const float c = (ms == -INFINITY) ? 0.f : exp2f(ms - M);
    s_c[s] = c;
    lsum += c * get_l(s);
  }
  lsum = warp_sum(lsum);
  return 1.f / lsum;
}
// One output dim: sum_s s_c[s] * acc_s in split order (independent loads, unrolled).
template <typename GetAcc>
__device__ __forceinline__ float merge_dim(int nact, const float* s_c, GetAcc get_acc) {
  float acc = 0.f;
#pragma unroll 8
  for (int s = 0; s < nact; ++s) acc = fmaf(s_c[s], get_acc(s), acc);
  return acc;
}

// The decode splits' partials in the workspace (T tokens x n_heads x nsplit splits): (m, l) pairs
// [T][n_heads][nsplit][2], then acc [T][n_heads][nsplit][HD]; for (token t, head h) the index of its
// first split (base) and its active splits at that token's context length (nact).
struct SplitPartials {
  const float* ml;
  const float* acc;
  int64_t base;
  int nact;
};
__device__ __forceinline__ SplitPartials split_partials(const AttnArgs& a, int nsplit, int T, int t, int h) {
  const int L = a.pos0[0] + t + 1;
  SplitPartials p;
  p.ml = a.workspace;
  p.acc = a.workspace + int64_t(T) * a.n_heads * nsplit * 2;
  p.base = (int64_t(t) * a.n_heads + h) * nsplit;
  p.nact = decode_nact(L, nsplit, decode_chunk(L, nsplit, a.dec_min_chunk));
  return p;
}

// Merge the active splits [0, nact) of one (token t, head h) from the workspace partials into the
// output (all threads of the block call it; ends with a barrier): warp 0 turns the splits' (m, l)
// into weights, then every thread sums its dims over the splits. Shared by attn_combine_kernel and
// the fused merges of attn_decode_kernel: one arithmetic (merge_weights, merge_dim).
template <typename TA>
__device__ __forceinline__ void attn_merge_head(const AttnArgs& a, const float* ws_ml, const float* ws_acc, int64_t base,
                                                int nact, int HD, int t, int h, float* s_c, float& s_inv_l) {
  if (threadIdx.x < 32) {
    const float inv = merge_weights(
        threadIdx.x, nact, [&](int s) { return __ldcg(ws_ml + (base + s) * 2); },
        [&](int s) { return __ldcg(ws_ml + (base + s) * 2 + 1); }, s_c);
    if (threadIdx.x == 0) s_inv_l = inv;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < HD; d += blockDim.x) {
    const float acc = merge_dim(nact, s_c, [&](int s) { return __ldcg(ws_acc + (base + s) * HD + d); });
    static_cast<TA*>(a.out)[int64_t(t) * a.out_stride + int64_t(h) * HD + d] = from_f32<TA>(acc * s_inv_l);
  }
  __syncthreads();
}

constexpr int kDecGT = 4;  // q heads per decode block

// The fused kernel's merge of its cluster's splits (FUSED below): warp g < nh turns head g's split
// states into weights, then the cluster's blocks share the nh*HD outputs (block `rank` takes
// outputs rank*128 + tid, + C*128, ...; up to GT*HD/128 per thread, their loads issued together
// split by split; per output the sum of merge_dim in its order). get_ml(s, g, which) /
// get_acc(s, g, d) read split s.
template <typename TA, int HD, int GT, typename GetMl, typename GetAcc>
__device__ __forceinline__ void decode_cluster_merge(const AttnArgs& a, int nact, int nh, int h0, int rank, int C,
                                                     GetMl get_ml, GetAcc get_acc, float (*s_c)[kDecodeMaxSplits],
                                                     float* s_inv) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp < nh) {
    const float inv = merge_weights(
        lane, nact, [&](int s) { return get_ml(s, warp, 0); }, [&](int s) { return get_ml(s, warp, 1); }, s_c[warp]);
    if (lane == 0) s_inv[warp] = inv;
  }
  __syncthreads();
  constexpr int MO = (GT * HD + 127) / 128;  // outputs per thread at C = 1 (128 threads)
  float o[MO];
  int gi[MO], di[MO];
#pragma unroll
  for (int j = 0; j < MO; ++j) {
    const int i = rank * 128 + int(threadIdx.x) + j * C * 128;
    gi[j] = i < nh * HD ? i / HD : -1;
    di[j] = i % HD;
    o[j] = 0.f;
  }
#pragma unroll 8
  for (int s = 0; s < nact; ++s) {
#pragma unroll
    for (int j = 0; j < MO; ++j)
      if (gi[j] >= 0) o[j] = fmaf(s_c[gi[j]][s], get_acc(s, gi[j], di[j]), o[j]);
  }
#pragma unroll
  for (int j = 0; j < MO; ++j)
    if (gi[j] >= 0) static_cast<TA*>(a.out)[int64_t(h0 + gi[j]) * HD + di[j]] = from_f32<TA>(o[j] * s_inv[gi[j]]);
}

// FUSED (attention_decode_rope, T = 1, RING > 0; launched in clusters of a.dec_cluster splits along
// grid y): this step's q, k, v arrive unrotated (a.q, a.k_new, a.v_new); each block rotates its q
// heads (rope_lo/rope_hi, the rope kernels' arithmetic, rounded to the compute dtype), the block
// holding position pos = L-1 rotates k and puts this step's k and v (rounded as the cache holds them)
// into its ring in place of a cache load, and its first head chunk writes them to the cache. The
// ring's first RING-1 iterations go out before the PDL wait: they read positions < pos, written by
// earlier steps (the engine completes a step before the next). Splits merge without a second
// launch: one active cluster (L <= C slices) merges in distributed shared memory; more clusters
// write their partials to the workspace and the last cluster to count in (counter per block
// column, reset by it) merges them all (C = 1: plain blocks, the last block of a column merges).
// Same arithmetic as rope_kv + the split kernel + combine.
template <typename TA, typename TK, int HD, int RING, bool FUSED>
__global__ void __launch_bounds__(128) attn_decode_kernel(const AttnArgs a, int nsplit, int hchunks) {
  static_assert(!FUSED || RING > 0, "the fused kernel puts this step's K/V into its ring");
  pdl_trigger();
  if constexpr (!FUSED) pdl_wait();
  constexpr int LP = HD / 8, PW = 32 / LP, NW = 4, GT = kDecGT;
  constexpr int U = 2;  // positions per lane group and iteration (4 measured slower at ctx 32768, RING 0)
  constexpr int NCP = sizeof(Raw8<TK>) / 16;  // 16-byte copies per lane, position and K or V
  constexpr int RS = RING == 0 ? 1 : (NCP == 2 ? 2 : RING);  // ring slots (f32: 2, 32 KB)
  __shared__ uint4 s_ring[RS][U][2][NCP][128];
  __shared__ float s_acc[NW][GT][HD];
  __shared__ float s_ml[NW][GT][2];
  const DecodeBlock db = decode_block(a, nsplit, hchunks, GT);
  if constexpr (FUSED) {
    // a cluster whose first split is idle leaves as a whole; idle splits of an active cluster stay
    // (no loads: their slice is empty) for the cluster's barriers
    if ((db.split - db.split % a.dec_cluster) * db.chunk >= db.L) return;
  } else {
    if (!db.active()) return;  // inactive split (whole block)
  }
  const int kvh = db.kvh, h0 = db.h0, nh = db.nh, t = db.t, split = db.split, L = db.L, chunk = db.chunk;
  const int s0 = db.s0, s1 = db.s1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pg = lane / LP, li = lane % LP;
  const float qs = a.scale * kLog2e;

  float q[GT][8], m[GT], l[GT], acc[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
  }
  if constexpr (!FUSED) {
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      const TA* qp = static_cast<const TA*>(a.q) + int64_t(t) * a.q_stride + int64_t(h0 + min(g, nh - 1)) * HD + 8 * li;
#pragma unroll
      for (int i = 0; i < 8; ++i) q[g][i] = to_f32<TA>(qp[i]) * qs;
    }
  }
  const TK* kb = static_cast<const TK*>(a.k_cache) + int64_t(kvh) * a.capacity * HD + 8 * li;
  const TK* vb = static_cast<const TK*>(a.v_cache) + int64_t(kvh) * a.capacity * HD + 8 * li;

  // iteration j of this warp: positions pb + u * NW * PW + pg, pb = base + warp * PW + j * stride
  // (decode_span: stride NW * PW * U in a contiguous slice); positions past the span's end load
  // position base (in range) and are masked. FUSED walks its slice in order.
  const DecodeSpan sp = FUSED ? DecodeSpan{s0, NW * PW * U, s1} : decode_span(a, db, NW * PW * U);
  const int pstart = sp.base + warp * PW, pend = sp.end;
  const int niter = sp.steps(warp * PW);
  auto pos_of = [&](int j, int u) { return pstart + j * sp.stride + u * NW * PW + pg; };
  // FUSED: this step's position, the (iteration, unit) where this thread meets it (jp < 0: never)
  // and its k/v once computed (after the PDL wait)
  const int pnew = L - 1;
  int jp = -1, up = 0;
  if constexpr (FUSED) {
    const int dlt = pnew - pstart - pg;
    if (s1 == L && dlt >= 0 && dlt % (NW * PW) == 0) jp = dlt / (NW * PW) / U, up = dlt / (NW * PW) % U;
  }
  uint4 kn[NCP], vn[NCP];
  bool fresh = false;
  auto issue = [&](int j) {  // RING: iteration j's copies into slot j % RS (empty group past the end)
    if (j < niter) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = pos_of(j, u), pc = p < pend ? p : sp.base;
        if (FUSED && j == jp && u == up) {  // this step's k/v: stored once known
          if (fresh) {
#pragma unroll
            for (int c = 0; c < NCP; ++c) {
              s_ring[j % RS][u][0][c][threadIdx.x] = kn[c];
              s_ring[j % RS][u][1][c][threadIdx.x] = vn[c];
            }
          }
          continue;
        }
#pragma unroll
        for (int c = 0; c < NCP; ++c) {
          cp_async16(&s_ring[j % RS][u][0][c][threadIdx.x], kb + int64_t(pc) * HD + c * (16 / sizeof(TK)), true);
          cp_async16(&s_ring[j % RS][u][1][c][threadIdx.x], vb + int64_t(pc) * HD + c * (16 / sizeof(TK)), true);
        }
      }
    }
    cp_async_commit();
  };
  if constexpr (RING > 0) {
#pragma unroll
    for (int j = 0; j < RS - 1; ++j) issue(j);
  }
  if constexpr (FUSED) {
    pdl_wait();
    // rotate this lane's 8 dims (e = 8 li + i) of q (and k where this thread meets pnew): the
    // lower half pairs with e + HD/2, the upper with e - HD/2 (frequency e mod HD/2)
    constexpr int HALF = HD / 2;
    const bool lo = 8 * li < HALF;
    const int pd = lo ? 8 * li + HALF : 8 * li - HALF;  // partner dims
    float sn[8], cs[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) rope_angle(pnew, a.inv_freq, (lo ? 8 * li : pd) + i, sn[i], cs[i]);
    auto rotate = [&](const TA* row, float* y) {  // y = the rotated values rounded to TA
      float x[8], xp[8];
      unpack_raw8<TA>(load_raw8<TA>(row + 8 * li), x);
      unpack_raw8<TA>(load_raw8<TA>(row + pd), xp);
#pragma unroll
      for (int i = 0; i < 8; ++i)
        y[i] = to_f32<TA>(from_f32<TA>(lo ? rope_lo(x[i], xp[i], cs[i], sn[i]) : rope_hi(xp[i], x[i], cs[i], sn[i])));
    };
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      float y[8];
      rotate(static_cast<const TA*>(a.q) + int64_t(h0 + min(g, nh - 1)) * HD, y);
#pragma unroll
      for (int i = 0; i < 8; ++i) q[g][i] = y[i] * qs;
    }
    if (jp >= 0) {
      float y[8], v[8];
      rotate(static_cast<const TA*>(a.k_new) + int64_t(kvh) * HD, y);
      unpack_raw8<TA>(load_raw8<TA>(static_cast<const TA*>(a.v_new) + int64_t(kvh) * HD + 8 * li), v);
      TK kt[8], vt[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) kt[i] = from_f32<TK>(y[i]), vt[i] = from_f32<TK>(v[i]);
      static_assert(sizeof(kt) == 16 * NCP, "8 cache values per 16-byte copy group");
      memcpy(kn, kt, sizeof(kt));
      memcpy(vn, vt, sizeof(vt));
      fresh = true;
      if (jp < RS - 1) {  // its slot was issued before the wait
#pragma unroll
        for (int c = 0; c < NCP; ++c) {
          s_ring[jp % RS][up][0][c][threadIdx.x] = kn[c];
          s_ring[jp % RS][up][1][c][threadIdx.x] = vn[c];
        }
      }
      if (blockIdx.x % hchunks == 0 && pnew < a.capacity) {  // the cache write (one block per kv head)
        TK* kd = static_cast<TK*>(const_cast<void*>(a.k_cache)) + (int64_t(kvh) * a.capacity + pnew) * HD + 8 * li;
        TK* vd = static_cast<TK*>(const_cast<void*>(a.v_cache)) + (int64_t(kvh) * a.capacity + pnew) * HD + 8 * li;
#pragma unroll
        for (int c = 0; c < NCP; ++c) {
          reinterpret_cast<uint4*>(kd)[c] = kn[c];
          reinterpret_cast<uint4*>(vd)[c] = vn[c];
        }
      }
    }
  }
  for (int j = 0; j < niter; ++j) {
    Raw8<TK> kr[U], vr[U];
    bool valid[U];
    if constexpr (RING > 0) {
      issue(j + RS - 1);  // into the slot iteration j-1 read
      cp_async_wait<RS - 1>();  // this thread's copies of iteration j have landed
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int p = pos_of(j, u);
      valid[u] = p < pend;
      if constexpr (RING > 0) {
        uint4 raw[2][NCP];
#pragma unroll
        for (int c = 0; c < NCP; ++c) {
          raw[0][c] = s_ring[j % RS][u][0][c][threadIdx.x];
          raw[1][c] = s_ring[j % RS][u][1][c][threadIdx.x];
        }
        kr[u] = raw8_from_u4<TK>(raw[0]);
        vr[u] = raw8_from_u4<TK>(raw[1]);
      } else {
        const int pc = valid[u] ? p : sp.base;
        kr[u] = load_raw8<TK>(kb + int64_t(pc) * HD);
        vr[u] = load_raw8<TK>(vb + int64_t(pc) * HD);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8], vf[8];
      unpack_raw8<TK>(kr[u], kf);
      unpack_raw8<TK>(vr[u], vf);
#pragma unroll
      for (int g = 0; g < GT; ++g) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) s = fmaf(q[g][i], kf[i], s);
#pragma unroll
        for (int o = LP / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (!valid[u]) s = -INFINITY;
        const float mn = fmaxf(m[g], s);
        const float corr = (mn == -INFINITY) ? 1.f : exp2f(m[g] - mn);
        const float pe = (s == -INFINITY) ? 0.f : exp2f(s - mn);
        l[g] = l[g] * corr + pe;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(pe, vf[i], acc[g][i] * corr);
        m[g] = mn;
      }
    }
  }
  // merge lane groups of the warp (same li, different pg)
#pragma unroll
  for (int o = LP; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[g], o), l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
      float a2[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) a2[i] = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
      softmax_merge(m[g], l[g], acc[g], m2, l2, a2, 8);
    }
  }
  if (pg == 0) {
#pragma unroll
    for (int g = 0; g < GT; ++g) {
#pragma unroll
      for (int i = 0; i < 8; ++i) s_acc[warp][g][8 * li + i] = acc[g][i];
      if (li == 0) { s_ml[warp][g][0] = m[g]; s_ml[warp][g][1] = l[g]; }
    }
  }
  __syncthreads();
  // merge warps; write the split's partial (FUSED: also kept in shared memory for the cluster)
  __shared__ float s_pacc[FUSED ? GT : 1][HD];
  __shared__ float s_pml[FUSED ? GT : 1][2];
  const int64_t n_heads = a.n_heads;
  float* ws_ml = a.workspace;
  float* ws_acc = a.workspace + int64_t(gridDim.z) * n_heads * nsplit * 2;
  for (int i = threadIdx.x; i < nh * HD; i += blockDim.x) {
    const int g = i / HD, d = i % HD;
    float M = -INFINITY;
    for (int w = 0; w < NW; ++w) M = fmaxf(M, s_ml[w][g][0]);
    float lsum = 0.f, asum = 0.f;
    for (int w = 0; w < NW; ++w) {
      const float c = (s_ml[w][g][0] == -INFINITY) ? 0.f : exp2f(s_ml[w][g][0] - M);
      lsum += s_ml[w][g][1] * c;
      asum += s_acc[w][g][d] * c;
    }
    const int64_t pi = (int64_t(t) * n_heads + h0 + g) * nsplit + split;
    ws_acc[pi * HD + d] = asum;
    if (d == 0) { ws_ml[pi * 2] = M; ws_ml[pi * 2 + 1] = lsum; }
    if constexpr (FUSED) {
      s_pacc[g][d] = asum;
      if (d == 0) { s_pml[g][0] = M; s_pml[g][1] = lsum; }
    }
  }
  __shared__ float s_c[FUSED ? GT : 1][kDecodeMaxSplits];
  __shared__ float s_inv[FUSED ? GT : 1];
  if constexpr (FUSED) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    const cg::cluster_group cl = cg::this_cluster();
    const int C = a.dec_cluster, rank = int(cl.block_rank());
    const int nact = decode_nact(L, nsplit, chunk);
    if (nact <= C) {  // one active cluster: splits s = ranks s
      cl.sync();
      decode_cluster_merge<TA, HD, GT>(
          a, nact, nh, h0, rank, C,
          [&](int s, int g, int which) { return cl.map_shared_rank(&s_pml[0][0], s)[g * 2 + which]; },
          [&](int s, int g, int d) { return cl.map_shared_rank(&s_pacc[0][0], s)[g * HD + d]; }, s_c, s_inv);
      cl.sync();  // no block leaves while the others read its shared memory
    } else {
      __shared__ int s_last;
      __threadfence();  // this block's partial visible GPU-wide before its cluster counts in
      cl.sync();
      if (rank == 0 && threadIdx.x == 0) {
        const int ncl = (nact + C - 1) / C;
        int* cnt = a.counters + blockIdx.x;
        const int done = atomicAdd(cnt, 1) + 1;
        s_last = done == ncl;
        if (done == ncl) *cnt = 0;  // ready for the next step (graph replay)
        __threadfence();
      }
      cl.sync();
      if (*cl.map_shared_rank(&s_last, 0)) {
        const int64_t base = int64_t(h0) * nsplit;  // t = 0
        decode_cluster_merge<TA, HD, GT>(
            a, nact, nh, h0, rank, C,
            [&](int s, int g, int which) { return __ldcg(ws_ml + (base + int64_t(g) * nsplit + s) * 2 + which); },
            [&](int s, int g, int d) { return __ldcg(ws_acc + (base + int64_t(g) * nsplit + s) * HD + d); }, s_c,
            s_inv);
      }
      cl.sync();  // rank 0's flag read by all before it leaves
    }
#else
    __trap();  // clusters need sm_90 (the host launches FUSED only there)
#endif
    return;
  }
  if (!a.counters) return;
  // fused combine: the group's last active split merges all of them (threadFenceReduction pattern)
  __shared__ int s_last;
  __shared__ float s_cc[kDecodeMaxSplits];
  __shared__ float s_inv_l;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int nact = decode_nact(L, nsplit, chunk);
    int* cnt = a.counters + int64_t(t) * gridDim.x + blockIdx.x;
    const int done = atomicAdd(cnt, 1) + 1;
    s_last = done == nact;
    if (done == nact) *cnt = 0;  // ready for the next step (graph replay)
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  const int nact = decode_nact(L, nsplit, chunk);
  for (int g = 0; g < nh; ++g)
    attn_merge_head<TA>(a, ws_ml, ws_acc, (int64_t(t) * n_heads + h0 + g) * nsplit, nact, HD, t, h0 + g, s_cc, s_inv_l);
}

// One block per (head, t): attn_merge_head.
template <typename TA>
__global__ void attn_combine_kernel(const AttnArgs a, int nsplit, int T) {
  pdl_trigger();
  pdl_wait();
  __shared__ float s_c[kDecodeMaxSplits];
  __shared__ float s_inv_l;
  const int h = blockIdx.x, t = blockIdx.y;
  const SplitPartials sp = split_partials(a, nsplit, T, t, h);
  attn_merge_head<TA>(a, sp.ml, sp.acc, sp.base, sp.nact, a.head_dim, t, h, s_c, s_inv_l);
}

template <typename TA, typename TK, int HD>
__global__ void __launch_bounds__(128) attn_prefill_kernel(const AttnArgs a) {
  constexpr int BQ = 16, BK = 32, RPW = 4, DPL = HD / 32;
  __shared__ float Ks[BK][HD + 1];
  __shared__ float Vs[BK][HD + 1];
  __shared__ float Qs[BQ][HD];
  const int h = blockIdx.y, G = a.n_heads / a.n_kv, kvh = h / G;
  const int t0 = blockIdx.x * BQ;
  const int pos0 = a.pos0[0];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float qs = a.scale * kLog2e;
  for (int i = threadIdx.x; i < BQ * HD; i += blockDim.x) {
    const int r = i / HD, d = i % HD;
    Qs[r][d] = (t0 + r < a.T) ? to_f32<TA>(static_cast<const TA*>(a.q)[int64_t(t0 + r) * a.q_stride + int64_t(h) * HD + d]) * qs : 0.f;
  }
  float m[RPW], l[RPW], acc[RPW][DPL];
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd) acc[i][dd] = 0.f;
  }
  const int kv_end = pos0 + min(t0 + BQ, a.T);  // exclusive
  const TK* kc = static_cast<const TK*>(a.k_cache) + int64_t(kvh) * a.capacity * HD;
  const TK* vc = static_cast<const TK*>(a.v_cache) + int64_t(kvh) * a.capacity * HD;
  for (int kb = 0; kb < kv_end; kb += BK) {
    __syncthreads();
    for (int i = threadIdx.x; i < BK * HD; i += blockDim.x) {
      const int j = i / HD, d = i % HD;
      const bool ok = kb + j < kv_end;
      Ks[j][d] = ok ? to_f32<TK>(kc[int64_t(kb + j) * HD + d]) : 0.f;
      Vs[j][d] = ok ? to_f32<TK>(vc[int64_t(kb + j) * HD + d]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RPW; ++i) {
      const int r = warp * RPW + i, t = t0 + r;
      if (t >= a.T) continue;
      const int qpos = pos0 + t;
      float s = 0.f;
#pragma unroll 16
      for (int d = 0; d < HD; ++d) s = fmaf(Qs[r][d], Ks[lane][d], s);
      const bool valid = kb + lane <= qpos;
      s = valid ? s : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(s));
      if (mn == -INFINITY) continue;
      const float corr = (m[i] == -INFINITY) ? 0.f : exp2f(m[i] - mn);
      const float p = valid ? exp2f(s - mn) : 0.f;
      l[i] = l[i] * corr + warp_sum(p);
#pragma unroll
      for (int dd = 0; dd < DPL; ++dd) acc[i][dd] *= corr;
#pragma unroll 8
      for (int j = 0; j < BK; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int dd = 0; dd < DPL; ++dd) acc[i][dd] = fmaf(pj, Vs[j][lane + 32 * dd], acc[i][dd]);
      }
      m[i] = mn;
    }
  }
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    const int t = t0 + warp * RPW + i;
    if (t >= a.T) continue;
#pragma unroll
    for (int dd = 0; dd < DPL; ++dd)
      static_cast<TA*>(a.out)[int64_t(t) * a.out_stride + int64_t(h) * HD + lane + 32 * dd] = from_f32<TA>(acc[i][dd] / l[i]);
  }
}

}  // namespace nf4flash::cuda
