// Small per-token kernels of the decoder step, f32 math, one rounding to the compute dtype.
//  embed     out[t, :] = table[ids[t], :]                      table [vocab, hidden] (any float dtype);
//            a vocabulary shard (shard_row0 >= 0): table[ids[t] - shard_row0], zeros outside it
//  rms_norm  out[r, :] = x[r, :] * rsqrt(mean(x[r,:]^2) + eps) * w     x, out [rows, cols]; w f32 [cols]
//            (per-head q/k norm: the caller's [T*heads, head_dim] view). Warp per row for cols <= 512;
//            above, one 256-thread block per row holding the row in registers (16-byte loads, all
//            issued before the reduction: one memory round trip, not one per 256 columns).
//  add_rms_norm  x[r, :] += d[r, :] (rounded to the compute dtype, as add() rounds it), then
//            out = rms_norm(x): the residual add of one sublayer and the norm of the next, one pass.
//  rope      rotate-half (transformers) in place on q [T, nq*hd] and k [T, nk*hd]; angle =
//            (pos0[0] + t) * inv_freq[i] in f32, sincosf (full range reduction: angles reach 1e5 rad).
//  silu_mul  out = silu(gate) * up;  gelu_tanh_mul  out = gelu_tanh(gate) * up;  add  out = a + b;
//            bias_add  out[r, c] += bias[c];  convert;  scale  x *= s;  softcap  x = tanh(x / c) * c.
//  kv_write  cache[h][pos0+t][:] = k[t, h*hd : (h+1)*hd]   (cache [n_kv][capacity][hd] of one layer)
//  rope_norm_kv  rope_kv with q and k normed per head first (rms_norm's arithmetic), one pass.
//  rope, kv_write and rope_kv over a paged step (PagedRows set): row t's position is its
//            sequence's (kernels/paged.cuh) and the cache position written is that position's slot.
#pragma once
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels/paged.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

template <typename TS, typename TD>
__global__ void convert_kernel(const TS* __restrict__ s, TD* __restrict__ d, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = from_f32<TD>(to_f32<TS>(s[i]));
}

template <typename TT, typename TA>
__global__ void embed_kernel(const TT* __restrict__ table, int64_t vocab, int64_t hidden,
                             const int32_t* __restrict__ ids, TA* __restrict__ out, int64_t shard_row0) {
  pdl_trigger();
  pdl_wait();
  const int64_t t = blockIdx.y;
  int64_t id = ids[t];
  if (shard_row0 >= 0) {  // a vocabulary shard: the other ranks' ids give zeros
    id -= shard_row0;
    if (id < 0 || id >= vocab) {
      for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < hidden; c += int64_t(gridDim.x) * blockDim.x)
        out[t * hidden + c] = from_f32<TA>(0.0f);
      return;
    }
  }
  id = id < 0 ? 0 : (id >= vocab ? vocab - 1 : id);  // the runtime validates ids on the host
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < hidden; c += int64_t(gridDim.x) * blockDim.x)
    out[t * hidden + c] = from_f32<TA>(to_f32<TT>(table[id * hidden + c]));
}

template <typename TA>
__global__ void rms_norm_warp_kernel(const TA* __restrict__ x, const float* __restrict__ w, float eps,
                                     int64_t rows, int64_t cols, TA* __restrict__ out) {
  pdl_trigger();
  pdl_wait();
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (r >= rows) return;
  const int lane = threadIdx.x & 31;
  const TA* xr = x + r * cols;
  float v[16];  // cols <= 512
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int64_t c = lane + 32 * i;
    v[i] = c < cols ? to_f32<TA>(xr[c]) : 0.f;
    ss = fmaf(v[i], v[i], ss);
  }
  ss = warp_sum(ss);
  const float inv = rsqrtf(ss / float(cols) + eps);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int64_t c = lane + 32 * i;
    if (c < cols) out[r * cols + c] = from_f32<TA>(v[i] * inv * w[c]);
  }
}

template <typename TA>
__global__ void __launch_bounds__(256) rms_norm_block_kernel(const TA* __restrict__ x, const float* __restrict__ w,
                                                             float eps, int64_t cols, TA* __restrict__ out) {
  pdl_trigger();
  pdl_wait();
  __shared__ float part[8];
  const int64_t r = blockIdx.x;
  const TA* xr = x + r * cols;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = to_f32<TA>(xr[c]);
    ss = fmaf(v, v, ss);
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) tot += part[i];
  const float inv = rsqrtf(tot / float(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[r * cols + c] = from_f32<TA>(to_f32<TA>(xr[c]) * inv * w[c]);
}

// 16 bytes of TA <-> E = 16 / sizeof(TA) floats.
template <typename TA>
__device__ __forceinline__ void load16_f32(const TA* p, float* f) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const TA* h = reinterpret_cast<const TA*>(&u);
#pragma unroll
  for (int i = 0; i < int(16 / sizeof(TA)); ++i) f[i] = to_f32<TA>(h[i]);
}
template <typename TA>
__device__ __forceinline__ void store16_f32(TA* p, const float* f) {
  uint4 u;
  TA* h = reinterpret_cast<TA*>(&u);
#pragma unroll
  for (int i = 0; i < int(16 / sizeof(TA)); ++i) h[i] = from_f32<TA>(f[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

// One 256-thread block per row; thread i holds 16-byte chunks i, i+256, .. (V of them), so
// cols <= 256 * V * E with cols % E == 0 and 16-byte aligned rows (the launcher checks).
// ADD: x += delta first (rounded to TA and written back), the norm taken of the rounded sum.
template <typename TA, int V, bool ADD>
__global__ void __launch_bounds__(256) rms_norm_vec_kernel(TA* __restrict__ x, const TA* __restrict__ delta,
                                                           const float* __restrict__ w, float eps, int cols,
                                                           TA* __restrict__ out) {
  constexpr int E = 16 / sizeof(TA);
  __shared__ float part[8];
  const int64_t base = int64_t(blockIdx.x) * cols;
  const int nvec = cols / E;
  float f[V][E], wv[V][E];
  float ss = 0.f;
  pdl_trigger();
#pragma unroll
  for (int v = 0; v < V; ++v) {  // the norm weight does not depend on earlier kernels: load it first
    const int c = threadIdx.x + v * 256;
    if (c < nvec) {
#pragma unroll
      for (int e = 0; e < E; e += 4) {
        const float4 w4 = *reinterpret_cast<const float4*>(w + c * E + e);
        wv[v][e] = w4.x, wv[v][e + 1] = w4.y, wv[v][e + 2] = w4.z, wv[v][e + 3] = w4.w;
      }
    }
  }
  pdl_wait();
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int c = threadIdx.x + v * 256;
    if (c < nvec) {
      load16_f32<TA>(x + base + int64_t(c) * E, f[v]);
      if constexpr (ADD) {
        float d[E];
        load16_f32<TA>(delta + base + int64_t(c) * E, d);
#pragma unroll
        for (int e = 0; e < E; ++e) f[v][e] = to_f32<TA>(from_f32<TA>(f[v][e] + d[e]));
        store16_f32<TA>(x + base + int64_t(c) * E, f[v]);
      }
#pragma unroll
      for (int e = 0; e < E; ++e) ss = fmaf(f[v][e], f[v][e], ss);
    }
  }
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
  __syncthreads();
  float tot = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) tot += part[i];
  const float inv = rsqrtf(tot / float(cols) + eps);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int c = threadIdx.x + v * 256;
    if (c < nvec) {
      float o[E];
#pragma unroll
      for (int e = 0; e < E; ++e) o[e] = f[v][e] * inv * wv[v][e];
      store16_f32<TA>(out + base + int64_t(c) * E, o);
    }
  }
}

// The rotate-half pair of rope at one frequency: (x1, x2) = (x[d], x[d + hd/2]) ->
// (x1 c - x2 s, x2 c + x1 s). Rounded explicitly (no contraction left to the compiler), so every
// kernel that rotates (rope, rope_kv, the fused decode attention) gets the same bits.
__device__ __forceinline__ float rope_lo(float x1, float x2, float c, float s) { return __fmaf_rn(x1, c, -__fmul_rn(x2, s)); }
__device__ __forceinline__ float rope_hi(float x1, float x2, float c, float s) { return __fmaf_rn(x2, c, __fmul_rn(x1, s)); }
// A row's position and its frequencies: row t of the step, or of its sequence when paged; the
// long table (longrope) when the row's forward ends past long_after positions; with dynamic NTK
// past dynamic_after, frequencies from the base dyn_base of the forward's end (0: the table).
// seq: the row's sequence when paged (0 otherwise).
struct RopeRow {
  int64_t pos;
  const float* inv_freq;
  int seq;
  float dyn_base;
};
// The angle of frequency f of row rr at position pos: sincosf(float(pos) * inv_freq[f]), both
// times mscale (exactly 1 but for longrope and yarn).
__device__ __forceinline__ void rope_angle(int64_t pos, const RopeRow& rr, int f, int head_dim, float mscale, float& s,
                                           float& c) {
  const float inv = rr.dyn_base > 0.f ? 1.0f / powf(rr.dyn_base, float(2 * f) / float(head_dim)) : rr.inv_freq[f];
  sincosf(float(pos) * inv, &s, &c);
  s *= mscale;
  c *= mscale;
}
__device__ __forceinline__ RopeRow rope_row(const RopeArgs& a, int64_t t) {
  int64_t pos, end;
  int seq = 0;
  if (a.paged.tables) {
    const PagedRow r = paged_row(a.paged, int(t));
    pos = r.pos;
    seq = r.seq;
    end = int64_t(a.paged.pos0[r.seq]) + r.n_rows;
  } else {
    pos = a.pos0[0] + t;
    end = a.pos0[0] + a.T;
  }
  float dyn_base = 0.f;
  if (a.dynamic_after > 0 && end > a.dynamic_after) {  // transformers' dynamic NTK base, in f32
    const float t = a.dynamic_factor * float(end) / float(a.dynamic_after) - (a.dynamic_factor - 1.0f);
    dyn_base = a.dynamic_theta * powf(t, float(double(a.head_dim) / double(a.head_dim - 2)));
  }
  return RopeRow{pos, a.inv_freq_long && end > a.long_after ? a.inv_freq_long : a.inv_freq, seq, dyn_base};
}

template <typename TA>
__global__ void rope_kernel(const RopeArgs a) {
  const int half = a.head_dim / 2;
  const int heads = a.n_q_heads + a.n_k_heads;
  const int64_t total = a.T * heads * half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int d = int(i % half);
    const int h = int((i / half) % heads);
    const int64_t t = i / (int64_t(half) * heads);
    TA* base = h < a.n_q_heads ? static_cast<TA*>(a.q) + t * a.q_stride + int64_t(h) * a.head_dim
                               : static_cast<TA*>(a.k) + t * a.k_stride + int64_t(h - a.n_q_heads) * a.head_dim;
    float sn, cs;
    const RopeRow rr = rope_row(a, t);
    rope_angle(rr.pos, rr, d, a.head_dim, a.mscale, sn, cs);
    const float x1 = to_f32<TA>(base[d]), x2 = to_f32<TA>(base[d + half]);
    base[d] = from_f32<TA>(rope_lo(x1, x2, cs, sn));
    base[d + half] = from_f32<TA>(rope_hi(x1, x2, cs, sn));
  }
}

// Binary elementwise ops (silu_mul: SiluMulOp(gate, up); add: AddOp) over n elements, out may
// alias either input: binary_vec_kernel over 16-byte chunks (n % E == 0, 16-byte aligned: the
// launcher checks), binary_kernel one element per step for the rest; grid-stride.
struct SiluMulOp {
  __device__ __forceinline__ float operator()(float g, float u) const { return g / (1.f + __expf(-g)) * u; }
};
struct AddOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
// gelu_pytorch_tanh(g) * u = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u (Gemma's GeGLU)
struct GeluTanhMulOp {
  __device__ __forceinline__ float operator()(float g, float u) const {
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
  }
};

// x[i] = x[i] * s (SOFTCAP false) or tanh(x[i] / s) * s (SOFTCAP true), in place over n elements.
template <typename TA, bool SOFTCAP>
__global__ void scale_kernel(TA* x, float s, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_f32<TA>(x[i]);
    x[i] = from_f32<TA>(SOFTCAP ? tanhf(v / s) * s : v * s);
  }
}

template <typename TA, typename Op>
__global__ void binary_kernel(const TA* a, const TA* b, TA* o, int64_t n) {
  pdl_trigger();
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    o[i] = from_f32<TA>(Op{}(to_f32<TA>(a[i]), to_f32<TA>(b[i])));
}
template <typename TA, typename Op>
__global__ void binary_vec_kernel(const TA* a, const TA* b, TA* o, int64_t nvec) {
  pdl_trigger();
  pdl_wait();
  constexpr int E = 16 / sizeof(TA);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += int64_t(gridDim.x) * blockDim.x) {
    float af[E], bf[E];
    load16_f32<TA>(a + i * E, af);
    load16_f32<TA>(b + i * E, bf);
#pragma unroll
    for (int e = 0; e < E; ++e) af[e] = Op{}(af[e], bf[e]);
    store16_f32<TA>(o + i * E, af);
  }
}

// u[r, c] = silu(g[r, c]) * u[r, c] over a [rows, cols] block of two row-major matrices with
// leading dimensions ldg, ldu (SiluMulOp: bit for bit silu_mul); 16-byte chunks (cols, ldg, ldu
// multiples of 16 / sizeof(TA), 16-byte aligned: the launcher checks), grid-stride.
template <typename TA>
__global__ void silu_mul_cols_kernel(const TA* g, int64_t ldg, TA* u, int64_t ldu, int64_t rows, int64_t cols) {
  constexpr int E = 16 / sizeof(TA);
  const int64_t cv = cols / E, n = rows * cv;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cv, c = (i - r * cv) * E;
    float gf[E], uf[E];
    load16_f32<TA>(g + r * ldg + c, gf);
    load16_f32<TA>(u + r * ldu + c, uf);
#pragma unroll
    for (int e = 0; e < E; ++e) uf[e] = SiluMulOp{}(gf[e], uf[e]);
    store16_f32<TA>(u + r * ldu + c, uf);
  }
}

template <typename TA>
__global__ void bias_add_kernel(TA* o, const float* __restrict__ bias, int64_t rows, int64_t cols) {
  // row-major walk: the column advances by the stride modulo cols (no 64-bit division per element)
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, n = rows * cols, step = stride % cols;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, c = i % cols;
  for (; i < n; i += stride) {
    o[i] = from_f32<TA>(to_f32<TA>(o[i]) + bias[c]);
    c += step;
    if (c >= cols) c -= cols;
  }
}

template <typename TA, typename TK>
__global__ void kv_write_kernel(const KvWriteArgs a) {
  const int64_t per_t = int64_t(a.n_kv) * a.head_dim;
  const int64_t total = a.T * per_t;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_t, hd = i % per_t;
    const int64_t h = hd / a.head_dim, d = hd % a.head_dim;
    int64_t pos = a.pos0 ? a.pos0[0] + t : 0;
    if (a.paged.tables) {
      const PagedRow r = paged_row(a.paged, int(t));
      pos = paged_slot(a.paged, r.seq, r.pos);
    }
    if (pos < 0 || pos >= a.capacity) continue;  // the runtime bounds positions by the capacity
    const int64_t dst = (h * a.capacity + pos) * a.head_dim + d;
    static_cast<TK*>(a.k_cache)[dst] = from_f32<TK>(to_f32<TA>(static_cast<const TA*>(a.k)[t * a.k_stride + hd]));
    static_cast<TK*>(a.v_cache)[dst] = from_f32<TK>(to_f32<TA>(static_cast<const TA*>(a.v)[t * a.v_stride + hd]));
  }
}

// The cache row of kv head h at slot (one layer's [n_kv][capacity][head_dim] k cache).
template <typename TK>
__device__ __forceinline__ TK* rope_k_cache_row(const KvWriteArgs& kv, int h, int64_t slot) {
  return static_cast<TK*>(kv.k_cache) + (h * kv.capacity + slot) * kv.head_dim;
}
// Element j of token t's v row (kv head j / head_dim) into the v cache at slot.
template <typename TA, typename TK>
__device__ __forceinline__ void rope_v_store(const KvWriteArgs& kv, int64_t t, int j, int64_t slot) {
  const int h = j / kv.head_dim, d = j - h * kv.head_dim;
  static_cast<TK*>(kv.v_cache)[(h * kv.capacity + slot) * kv.head_dim + d] =
      from_f32<TK>(to_f32<TA>(static_cast<const TA*>(kv.v)[t * kv.v_stride + j]));
}
// A rotated pair (d, d + half) of a q or k head, rounded to the compute dtype, into base; with
// dst (a cached k row) also into the cache from the rounded values.
template <typename TA, typename TK>
__device__ __forceinline__ void rope_store_pair(TA* base, TK* dst, int d, int half, float y1f, float y2f) {
  const TA y1 = from_f32<TA>(y1f), y2 = from_f32<TA>(y2f);
  base[d] = y1;
  base[d + half] = y2;
  if (dst) {
    dst[d] = from_f32<TK>(to_f32<TA>(y1));
    dst[d + half] = from_f32<TK>(to_f32<TA>(y2));
  }
}

// rope + kv_write in one pass (decode and prefill): q and k rotated in place exactly as
// rope_kernel does, the rotated k (rounded to the compute dtype, as kv_write would read it) and v
// written to the cache at positions pos0 + t. Grid: y walks the tokens t, x the (nq+nk)*hd/2
// rotation pairs then the nkv*hd v elements of one token (32-bit index math).
template <typename TA, typename TK>
__global__ void rope_kv_kernel(const RopeArgs r, const KvWriteArgs kv) {
  pdl_trigger();
  pdl_wait();
  const int half = r.head_dim / 2;
  const int n_r = (r.n_q_heads + r.n_k_heads) * half, n_v = kv.n_kv * kv.head_dim;
  const bool paged = kv.paged.tables != nullptr;
  for (int64_t t = blockIdx.y; t < r.T; t += gridDim.y) {
    // the position (the angle) and the cache position it is written to (its block slot when paged)
    const RopeRow rr = rope_row(r, t);  // (rope and cache share the step's rows: one lookup)
    const int64_t pos = rr.pos, slot = paged ? paged_slot(kv.paged, rr.seq, int(pos)) : pos;
    const bool cached = slot >= 0 && slot < kv.capacity;  // the runtime bounds positions by the capacity
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_r + n_v; i += gridDim.x * blockDim.x) {
      if (i < n_r) {
        const int h = i / half, d = i - h * half;
        const bool is_k = h >= r.n_q_heads;
        TA* base = !is_k ? static_cast<TA*>(r.q) + t * r.q_stride + int64_t(h) * r.head_dim
                         : static_cast<TA*>(r.k) + t * r.k_stride + int64_t(h - r.n_q_heads) * r.head_dim;
        float sn, cs;
        rope_angle(pos, rr, d, r.head_dim, r.mscale, sn, cs);
        const float x1 = to_f32<TA>(base[d]), x2 = to_f32<TA>(base[d + half]);
        rope_store_pair<TA, TK>(base, is_k && cached ? rope_k_cache_row<TK>(kv, h - r.n_q_heads, slot) : nullptr, d,
                                half, rope_lo(x1, x2, cs, sn), rope_hi(x1, x2, cs, sn));
      } else if (cached) {
        rope_v_store<TA, TK>(kv, t, i - n_r, slot);
      }
    }
  }
}

// rope_kv_kernel with q and k normed per head first (Qwen3's and Gemma 3's q/k norms): a warp a
// (token, head), lane l holding elements l + 32 i (i < NI = head_dim / 32). The norm is
// rms_norm_warp_kernel's arithmetic (each lane's squares summed in i order, warp_sum, the output
// rounded to the compute dtype), the rotation rope_kv_kernel's on those rounded values: pair (d,
// d + head_dim/2) with d = l + 32 j is elements j and j + NI/2 of the lane. q and k hold the normed,
// rotated heads; the rotated k and v go to the cache at the row's position. Grid: y walks the
// tokens; x's warps the nq + nk heads, its threads the nkv * head_dim v elements.
template <typename TA, typename TK, int NI>
__global__ void rope_norm_kv_kernel(const RopeArgs r, const KvWriteArgs kv) {
  static_assert(NI % 2 == 0 && NI <= 16, "rope_norm_kv_kernel: head_dim a multiple of 64, at most 512");
  pdl_trigger();
  pdl_wait();
  constexpr int HD = 32 * NI, HALF = HD / 2;
  const int heads = r.n_q_heads + r.n_k_heads, n_v = kv.n_kv * kv.head_dim;
  const int lane = threadIdx.x & 31, wpb = blockDim.x / 32;
  const int warp0 = blockIdx.x * wpb + (threadIdx.x >> 5), n_warps = gridDim.x * wpb;
  const bool paged = kv.paged.tables != nullptr;
  for (int64_t t = blockIdx.y; t < r.T; t += gridDim.y) {
    const RopeRow rr = rope_row(r, t);
    const int64_t pos = rr.pos, slot = paged ? paged_slot(kv.paged, rr.seq, int(pos)) : pos;
    const bool cached = slot >= 0 && slot < kv.capacity;  // the runtime bounds positions by the capacity
    for (int h = warp0; h < heads; h += n_warps) {
      const bool is_k = h >= r.n_q_heads;
      TA* base = !is_k ? static_cast<TA*>(r.q) + t * r.q_stride + int64_t(h) * HD
                       : static_cast<TA*>(r.k) + t * r.k_stride + int64_t(h - r.n_q_heads) * HD;
      const float* w = is_k ? r.k_norm : r.q_norm;
      float v[NI];
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        v[i] = to_f32<TA>(base[lane + 32 * i]);
        ss = fmaf(v[i], v[i], ss);
      }
      ss = warp_sum(ss);
      const float inv = rsqrtf(ss / float(HD) + r.norm_eps);
#pragma unroll
      for (int i = 0; i < NI; ++i) v[i] = to_f32<TA>(from_f32<TA>(v[i] * inv * w[lane + 32 * i]));
#pragma unroll
      for (int j = 0; j < NI / 2; ++j) {
        const int d = lane + 32 * j;
        float sn, cs;
        rope_angle(pos, rr, d, HD, r.mscale, sn, cs);
        rope_store_pair<TA, TK>(base, is_k && cached ? rope_k_cache_row<TK>(kv, h - r.n_q_heads, slot) : nullptr, d,
                                HALF, rope_lo(v[j], v[j + NI / 2], cs, sn), rope_hi(v[j], v[j + NI / 2], cs, sn));
      }
    }
    if (cached)
      for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n_v; j += gridDim.x * blockDim.x)
        rope_v_store<TA, TK>(kv, t, j, slot);
  }
}

}  // namespace nf4flash::cuda
