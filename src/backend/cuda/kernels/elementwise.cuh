// Small per-token kernels of the decoder step, f32 math, one rounding to the compute dtype.
//  embed     out[t, :] = table[ids[t], :]                      table [vocab, hidden] (any float dtype)
//  rms_norm  out[r, :] = x[r, :] * rsqrt(mean(x[r,:]^2) + eps) * w     x, out [rows, cols]; w f32 [cols]
//            (per-head q/k norm: the caller's [T*heads, head_dim] view). Warp per row for cols <= 512,
//            256-thread block per row above.
//  rope      rotate-half (transformers) in place on q [T, nq*hd] and k [T, nk*hd]; angle =
//            (pos0[0] + t) * inv_freq[i] in f32, sincosf (full range reduction: angles reach 1e5 rad).
//  silu_mul  out = silu(gate) * up;  add  out = a + b;  bias_add  out[r, c] += bias[c];  convert.
//  kv_write  cache[h][pos0+t][:] = k[t, h*hd : (h+1)*hd]   (cache [n_kv][capacity][hd] of one layer)
#pragma once
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

template <typename TS, typename TD>
__global__ void convert_kernel(const TS* __restrict__ s, TD* __restrict__ d, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = from_f32<TD>(to_f32<TS>(s[i]));
}

template <typename TT, typename TA>
__global__ void embed_kernel(const TT* __restrict__ table, int64_t vocab, int64_t hidden,
                             const int32_t* __restrict__ ids, TA* __restrict__ out) {
  const int64_t t = blockIdx.y;
  int64_t id = ids[t];
  id = id < 0 ? 0 : (id >= vocab ? vocab - 1 : id);  // the runtime validates ids on the host
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < hidden; c += int64_t(gridDim.x) * blockDim.x)
    out[t * hidden + c] = from_f32<TA>(to_f32<TT>(table[id * hidden + c]));
}

template <typename TA>
__global__ void rms_norm_warp_kernel(const TA* __restrict__ x, const float* __restrict__ w, float eps,
                                     int64_t rows, int64_t cols, TA* __restrict__ out) {
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
    const float pos = float(a.pos0[0] + t);
    float sn, cs;
    sincosf(pos * a.inv_freq[d], &sn, &cs);
    const float x1 = to_f32<TA>(base[d]), x2 = to_f32<TA>(base[d + half]);
    base[d] = from_f32<TA>(x1 * cs - x2 * sn);
    base[d + half] = from_f32<TA>(x2 * cs + x1 * sn);
  }
}

template <typename TA>
__global__ void silu_mul_kernel(const TA* __restrict__ g, const TA* __restrict__ u, TA* __restrict__ o, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gv = to_f32<TA>(g[i]);
    o[i] = from_f32<TA>(gv / (1.f + __expf(-gv)) * to_f32<TA>(u[i]));
  }
}

template <typename TA>
__global__ void add_kernel(const TA* a, const TA* b, TA* o, int64_t n) {  // o may alias a
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    o[i] = from_f32<TA>(to_f32<TA>(a[i]) + to_f32<TA>(b[i]));
}

template <typename TA>
__global__ void bias_add_kernel(TA* o, const float* __restrict__ bias, int64_t rows, int64_t cols) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x)
    o[i] = from_f32<TA>(to_f32<TA>(o[i]) + bias[i % cols]);
}

template <typename TA, typename TK>
__global__ void kv_write_kernel(const KvWriteArgs a) {
  const int64_t per_t = int64_t(a.n_kv) * a.head_dim;
  const int64_t total = a.T * per_t;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_t, hd = i % per_t;
    const int64_t h = hd / a.head_dim, d = hd % a.head_dim;
    const int64_t pos = a.pos0[0] + t;
    if (pos < 0 || pos >= a.capacity) continue;  // the runtime bounds positions by the capacity
    const int64_t dst = (h * a.capacity + pos) * a.head_dim + d;
    static_cast<TK*>(a.k_cache)[dst] = from_f32<TK>(to_f32<TA>(static_cast<const TA*>(a.k)[t * a.k_stride + hd]));
    static_cast<TK*>(a.v_cache)[dst] = from_f32<TK>(to_f32<TA>(static_cast<const TA*>(a.v)[t * a.v_stride + hd]));
  }
}

// rope + kv_write in one pass (decode and prefill): q and k rotated in place exactly as
// rope_kernel does, the rotated k (rounded to the compute dtype, as kv_write would read it) and v
// written to the cache at positions pos0 + t. Index space: T*(nq+nk)*hd/2 rotation pairs, then
// T*nkv*hd v elements.
template <typename TA, typename TK>
__global__ void rope_kv_kernel(const RopeArgs r, const KvWriteArgs kv) {
  const int half = r.head_dim / 2;
  const int heads = r.n_q_heads + r.n_k_heads;
  const int64_t total_r = r.T * heads * half, total_v = kv.T * int64_t(kv.n_kv) * kv.head_dim;
  const int64_t pos0 = r.pos0[0];
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total_r + total_v;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (i < total_r) {
      const int d = int(i % half);
      const int h = int((i / half) % heads);
      const int64_t t = i / (int64_t(half) * heads);
      const bool is_k = h >= r.n_q_heads;
      TA* base = !is_k ? static_cast<TA*>(r.q) + t * r.q_stride + int64_t(h) * r.head_dim
                       : static_cast<TA*>(r.k) + t * r.k_stride + int64_t(h - r.n_q_heads) * r.head_dim;
      float sn, cs;
      sincosf(float(pos0 + t) * r.inv_freq[d], &sn, &cs);
      const float x1 = to_f32<TA>(base[d]), x2 = to_f32<TA>(base[d + half]);
      const TA y1 = from_f32<TA>(x1 * cs - x2 * sn), y2 = from_f32<TA>(x2 * cs + x1 * sn);
      base[d] = y1;
      base[d + half] = y2;
      const int64_t pos = pos0 + t;
      if (is_k && pos >= 0 && pos < kv.capacity) {
        TK* dst = static_cast<TK*>(kv.k_cache) + ((h - r.n_q_heads) * kv.capacity + pos) * kv.head_dim;
        dst[d] = from_f32<TK>(to_f32<TA>(y1));
        dst[d + half] = from_f32<TK>(to_f32<TA>(y2));
      }
    } else {
      const int64_t j = i - total_r, per_t = int64_t(kv.n_kv) * kv.head_dim;
      const int64_t t = j / per_t, hd = j % per_t;
      const int64_t h = hd / kv.head_dim, d = hd % kv.head_dim;
      const int64_t pos = pos0 + t;
      if (pos < 0 || pos >= kv.capacity) continue;
      static_cast<TK*>(kv.v_cache)[(h * kv.capacity + pos) * kv.head_dim + d] =
          from_f32<TK>(to_f32<TA>(static_cast<const TA*>(kv.v)[t * kv.v_stride + hd]));
    }
  }
}

}  // namespace nf4flash::cuda
