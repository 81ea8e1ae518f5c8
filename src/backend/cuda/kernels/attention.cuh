// Causal attention of q [T, n_heads*hd] over the KV cache of one layer (K, V each
// [n_kv][capacity][hd]): query row t (absolute position pos0+t) sees cache positions [0, pos0+t].
// GQA: q head h reads kv head h / (n_heads/n_kv); K/V are never repeated in memory.
// Softmax in the log2 domain (q pre-scaled by scale*log2(e)), f32 throughout. head_dim: any
// multiple of 8 up to 256 (32, 64, 80, 96, 128, 256 instantiated). Sliding window (AttnArgs::window):
// row t sees keys (pos - window, pos]; soft-capping (AttnArgs::softcap): q is pre-scaled by scale
// only and each score becomes softcap * tanh(s / softcap) * log2(e) (the decode kernel's SOFTCAP
// instantiation; the others test the cap at run time).
//
// attn_decode_kernel (flash-decoding on CUDA cores, T <= 4): grid (n_kv * head_chunks, nsplit, T),
// 128 threads.
//   A block takes up to 4 q heads sharing one kv head and a contiguous slice of the sequence; the
//   slice length is max(kDecodeMinChunk, ceil(n/nsplit)) with n the visible keys of L = pos0+t+1
//   read on the device, so a captured graph stays valid as the context grows (idle splits exit at
//   once). LP = decode_lanes(HD) lanes hold one position (16-byte loads of K and V rows; lanes past
//   HD/8 load nothing), a warp covers 32/LP positions per step, two steps per iteration. Each thread's K/V bytes of an iteration go through its own ring of 4 slots
//   in shared memory (cp.async; [4][2][K|V][chunk][128 threads] x 16 bytes, 32 KB for bf16, f32
//   caches use 2 slots), so 3 iterations are in flight while one is summed (head_dim 256: the
//   warps' partials are merged through the ring's memory after the loop). Partials (m, l,
//   acc[hd]) go to the workspace; attn_combine_wide_kernel (attention_combine.cuh) merges the
//   splits per (t, head) in a second launch.
//   PAGED: rows of several sequences (AttnArgs::paged): row t's length and cache slots are its
//   sequence's (kernels/paged.cuh); rows of sequences longer than paged_max_rows exit at once.
// attn_prefill_kernel (any T; the memory-efficient path without tensor cores, "sdpa"):
//   grid (ceil(T/16), n_heads), 128 threads; 16 query rows per block, 4 per warp; K/V tiles of 32
//   positions staged in dynamic shared memory as f32 (rows padded by one word: conflict-free;
//   prefill_smem_bytes); online softmax; tiles before the block's window are skipped.
#pragma once
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels/cp_async.cuh"
#include "backend/cuda/kernels/elementwise.cuh"
#include "backend/cuda/kernels/paged.cuh"
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

// Fewest cache positions per decode split: fewer positions per block put more blocks on a short
// context, at the price of more partials to merge, which the wide combine loads together. Only
// contexts under ~16 positions per split see it (L < 16 * nsplit). H100, Llama-3-8B layer, decode
// attention + combine: 16 against 64 positions 5.46 / 7.43 / 8.66 / 10.71 us against 6.97 / 8.17 /
// 9.96 / 12.89 at ctx 128 / 512 / 1024 / 2048.
constexpr int kDecodeMinChunk = 16;

// Sequence slice of one decode split: at least kDecodeMinChunk positions, so short contexts use few
// splits (the combine reads only the active ones).
__host__ __device__ __forceinline__ int decode_chunk(int L, int nsplit) {
  const int c = (L + nsplit - 1) / nsplit;
  return c < kDecodeMinChunk ? kDecodeMinChunk : c;
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
  int kvh, h0, nh, t, split, L, chunk, s0, s1, nact, seq;
  __device__ bool active() const { return s0 < L; }
};

// The context length of query row t: pos0 + t + 1, or over a paged step its sequence's position + 1
// (0: a row of a sequence with more than a.paged_max_rows rows, which another kernel computes).
template <bool PAGED>
__device__ __forceinline__ int decode_row_len(const AttnArgs& a, int t, int* seq = nullptr) {
  if constexpr (PAGED) {
    const PagedRow r = paged_row(a.paged, t);
    if (seq) *seq = r.seq;
    return r.n_rows > a.paged_max_rows ? 0 : r.pos + 1;
  } else {
    return a.pos0[0] + t + 1;
  }
}
template <bool PAGED = false>
__device__ __forceinline__ DecodeBlock decode_block(const AttnArgs& a, int nsplit, int hchunks, int per_block) {
  DecodeBlock b;
  const int hc = blockIdx.x % hchunks, G = a.n_heads / a.n_kv;
  b.kvh = blockIdx.x / hchunks;
  b.h0 = b.kvh * G + hc * per_block;
  b.nh = min(per_block, G - hc * per_block);
  b.t = blockIdx.z, b.split = blockIdx.y;
  b.seq = 0;
  b.L = decode_row_len<PAGED>(a, b.t, &b.seq);
  const int lo = attn_first_key(b.L, a.window);  // the splits share the visible keys [lo, L)
  b.chunk = decode_chunk(b.L - lo, nsplit);
  b.s0 = lo + b.split * b.chunk, b.s1 = min(b.L, b.s0 + b.chunk);
  b.nact = decode_nact(b.L - lo, nsplit, b.chunk);
  return b;
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

// The decode splits' partials in the workspace (T tokens x n_heads x nsplit splits): (m, l) pairs
// [T][n_heads][nsplit][2], then acc [T][n_heads][nsplit][HD]; for (token t, head h) the index of its
// first split (base) and its active splits at that token's context length (nact).
struct SplitPartials {
  const float* ml;
  const float* acc;
  int64_t base;
  int nact;
};
template <bool PAGED = false>
__device__ __forceinline__ SplitPartials split_partials(const AttnArgs& a, int nsplit, int T, int t, int h) {
  const int L = decode_row_len<PAGED>(a, t), n = L - attn_first_key(L, a.window);
  SplitPartials p;
  p.ml = a.workspace;
  p.acc = a.workspace + int64_t(T) * a.n_heads * nsplit * 2;
  p.base = (int64_t(t) * a.n_heads + h) * nsplit;
  p.nact = decode_nact(n, nsplit, decode_chunk(n, nsplit));
  return p;
}

constexpr int kDecGT = 4;  // q heads per decode block

// The lanes holding one cache position in the decode kernel: HD/8 rounded up to a power of two
// (head_dim 80 and 96 take 16 lanes, 10 and 12 of them loading).
__host__ __device__ constexpr int decode_lanes(int hd) { return hd <= 32 ? 4 : hd <= 64 ? 8 : hd <= 128 ? 16 : 32; }

template <typename TA, typename TK, int HD, bool PAGED = false, bool SOFTCAP = false>
__global__ void __launch_bounds__(128) attn_decode_kernel(const AttnArgs a, int nsplit, int hchunks) {
  pdl_trigger();
  pdl_wait();
  static_assert(HD % 8 == 0 && HD <= 256, "head_dim a multiple of 8, at most 256");
  constexpr int LP = decode_lanes(HD), PW = 32 / LP, NW = 4, GT = kDecGT;
  constexpr int U = 2;  // positions per lane group and iteration
  constexpr int NCP = sizeof(Raw8<TK>) / 16;  // 16-byte copies per lane, position and K or V
  constexpr int RS = NCP == 2 ? 2 : 4;  // ring slots (f32: 2, 32 KB)
  // head_dim 256: the warps' partials reuse the ring after the loop (48 KiB of static shared memory)
  constexpr bool ACC_IN_RING = HD > 128;
  __shared__ uint4 s_ring[RS][U][2][NCP][128];
  __shared__ float s_acc_own[ACC_IN_RING ? 1 : NW][GT][ACC_IN_RING ? 1 : HD];
  __shared__ float s_ml[NW][GT][2];
  static_assert(!ACC_IN_RING || sizeof(s_ring) >= sizeof(float) * NW * GT * HD, "the ring holds the partials");
  auto s_acc = [&](int w, int g, int d) -> float& {
    if constexpr (ACC_IN_RING) return reinterpret_cast<float*>(&s_ring[0][0][0][0][0])[(w * GT + g) * HD + d];
    else return s_acc_own[w][g][d];
  };
  const DecodeBlock db = decode_block<PAGED>(a, nsplit, hchunks, GT);
  if (!db.active()) return;  // inactive split (whole block)
  const int kvh = db.kvh, h0 = db.h0, nh = db.nh, t = db.t, split = db.split;
  const int s0 = db.s0, s1 = db.s1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, pg = lane / LP, li = lane % LP;
  const bool dim_lane = HD == 8 * LP || 8 * li < HD;  // a lane past head_dim (80, 96) holds zeros
  // base-2 scores: q pre-scaled by scale * log2(e), or (SOFTCAP: a.softcap > 0) by scale, the cap
  // applied to the scaled score, then log2(e)
  const float qs = SOFTCAP ? a.scale : a.scale * kLog2e;

  float q[GT][8], m[GT], l[GT], acc[GT][8];
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    const TA* qp = static_cast<const TA*>(a.q) + int64_t(t) * a.q_stride + int64_t(h0 + min(g, nh - 1)) * HD + 8 * li;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[g][i] = dim_lane ? to_f32<TA>(qp[i]) * qs : 0.f;
  }
  const int lane_off = dim_lane ? 8 * li : 0;
  const TK* kb = static_cast<const TK*>(a.k_cache) + int64_t(kvh) * a.capacity * HD + lane_off;
  const TK* vb = static_cast<const TK*>(a.v_cache) + int64_t(kvh) * a.capacity * HD + lane_off;

  // iteration j of this warp: positions pb + u * NW * PW + pg, pb = s0 + warp * PW + j * NW * PW * U;
  // positions past the slice's end load position s0 (in range) and are masked.
  constexpr int stride = NW * PW * U;
  const int pstart = s0 + warp * PW, pend = s1;
  const int niter = pstart < pend ? (pend - pstart + stride - 1) / stride : 0;
  auto pos_of = [&](int j, int u) { return pstart + j * stride + u * NW * PW + pg; };
  auto issue = [&](int j) {  // iteration j's copies into slot j % RS (empty group past the end)
    if (j < niter) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = pos_of(j, u), pc = p < pend ? p : s0;
#pragma unroll
        for (int c = 0; c < NCP; ++c) {
          const int64_t cpos = PAGED ? paged_slot(a.paged, db.seq, pc) : pc;
          cp_async16(&s_ring[j % RS][u][0][c][threadIdx.x], kb + cpos * HD + c * (16 / sizeof(TK)), dim_lane);
          cp_async16(&s_ring[j % RS][u][1][c][threadIdx.x], vb + cpos * HD + c * (16 / sizeof(TK)), dim_lane);
        }
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int j = 0; j < RS - 1; ++j) issue(j);
  for (int j = 0; j < niter; ++j) {
    Raw8<TK> kr[U], vr[U];
    bool valid[U];
    issue(j + RS - 1);  // into the slot iteration j-1 read
    cp_async_wait<RS - 1>();  // this thread's copies of iteration j have landed
#pragma unroll
    for (int u = 0; u < U; ++u) {
      valid[u] = pos_of(j, u) < pend;
      uint4 raw[2][NCP];
#pragma unroll
      for (int c = 0; c < NCP; ++c) {
        raw[0][c] = s_ring[j % RS][u][0][c][threadIdx.x];
        raw[1][c] = s_ring[j % RS][u][1][c][threadIdx.x];
      }
      kr[u] = raw8_from_u4<TK>(raw[0]);
      vr[u] = raw8_from_u4<TK>(raw[1]);
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
        if constexpr (SOFTCAP) s = a.softcap * tanhf(s / a.softcap) * kLog2e;
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
  if constexpr (ACC_IN_RING) {
    cp_async_wait<0>();
    __syncthreads();  // every thread is done with its ring slots
  }
  if (pg == 0) {
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      if (dim_lane) {
#pragma unroll
        for (int i = 0; i < 8; ++i) s_acc(warp, g, 8 * li + i) = acc[g][i];
      }
      if (li == 0) { s_ml[warp][g][0] = m[g]; s_ml[warp][g][1] = l[g]; }
    }
  }
  __syncthreads();
  // merge warps; write the split's partial
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
      asum += s_acc(w, g, d) * c;
    }
    const int64_t pi = (int64_t(t) * n_heads + h0 + g) * nsplit + split;
    ws_acc[pi * HD + d] = asum;
    if (d == 0) { ws_ml[pi * 2] = M; ws_ml[pi * 2 + 1] = lsum; }
  }
}

constexpr int kPrefillBQ = 16, kPrefillBK = 32;
// Dynamic shared memory of attn_prefill_kernel: K and V tiles [BK][HD + 1] and Q [BQ][HD], f32.
__host__ __device__ constexpr int prefill_smem_bytes(int hd) { return (2 * kPrefillBK * (hd + 1) + kPrefillBQ * hd) * 4; }

template <typename TA, typename TK, int HD>
__global__ void __launch_bounds__(128) attn_prefill_kernel(const AttnArgs a) {
  constexpr int BQ = kPrefillBQ, BK = kPrefillBK, RPW = 4, DPL = (HD + 31) / 32;
  extern __shared__ float prefill_smem[];
  float(*Ks)[HD + 1] = reinterpret_cast<float(*)[HD + 1]>(prefill_smem);
  float(*Vs)[HD + 1] = reinterpret_cast<float(*)[HD + 1]>(prefill_smem + BK * (HD + 1));
  float(*Qs)[HD] = reinterpret_cast<float(*)[HD]>(prefill_smem + 2 * BK * (HD + 1));
  const int h = blockIdx.y, G = a.n_heads / a.n_kv, kvh = h / G;
  const int t0 = blockIdx.x * BQ;
  const int pos0 = a.pos0[0];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const bool capped = a.softcap > 0.f;  // as attn_decode_kernel
  const float qs = capped ? a.scale : a.scale * kLog2e;
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
  // sliding window: the block's first row sees nothing before its first key (tiles of BK from there)
  const int kv_begin = attn_first_key(pos0 + t0 + 1, a.window) / BK * BK;
  const TK* kc = static_cast<const TK*>(a.k_cache) + int64_t(kvh) * a.capacity * HD;
  const TK* vc = static_cast<const TK*>(a.v_cache) + int64_t(kvh) * a.capacity * HD;
  for (int kb = kv_begin; kb < kv_end; kb += BK) {
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
      if (capped) s = a.softcap * tanhf(s / a.softcap) * kLog2e;
      const bool valid = kb + lane <= qpos && kb + lane >= attn_first_key(qpos + 1, a.window);
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
        for (int dd = 0; dd < DPL; ++dd)
          if (lane + 32 * dd < HD) acc[i][dd] = fmaf(pj, Vs[j][lane + 32 * dd], acc[i][dd]);
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
      if (lane + 32 * dd < HD)
        static_cast<TA*>(a.out)[int64_t(t) * a.out_stride + int64_t(h) * HD + lane + 32 * dd] = from_f32<TA>(acc[i][dd] / l[i]);
  }
}

}  // namespace nf4flash::cuda
