// The 4-bit decode GEMV's x prologue (kernels/gemv_q4_decode.cuh): x
// [T, cols] (16-bit compute dtype) staged into shared memory rows of x_stride bytes, then, with
// norm_w (f32 [cols]), x = rms_norm(x) * norm_w per token in place, in rms_norm_vec_kernel's
// arithmetic and order (256 threads: thread i sums the 16-byte chunks i, i + 256, ... with fmaf,
// warp butterfly, the 8 warp sums in order; then x * inv * w per element), so the normalized rows
// are bit for bit what the unfused rms_norm writes. Blocks of 256 threads; cols % 8 == 0. Ends
// with a block barrier.
#pragma once
#include "backend/cuda/kernels/cp_async.cuh"
#include "backend/cuda/kernels/elementwise.cuh"

namespace nf4flash::cuda {

// x rows copied with cp.async (16-byte, L2 path): every chunk of the thread is in flight at once,
// one round trip for the whole staging (a load-then-store loop waited one L2 round trip per
// chunk under ncu: 7 in a row for a 14336-column x at 256 threads).
// Waits for its copies; the caller's barrier publishes them.
template <typename TA>
__device__ __forceinline__ void stage_x_rows(const void* x, int T, int64_t cols, int x_stride, uint8_t* xs) {
  const int n16 = int(cols / 8);
  const uint32_t xs_s = static_cast<uint32_t>(__cvta_generic_to_shared(xs));
  for (int n = 0; n < T; ++n) {
    const uint4* row = reinterpret_cast<const uint4*>(static_cast<const TA*>(x) + int64_t(n) * cols);
    for (int c = threadIdx.x; c < n16; c += blockDim.x) cp_async16_sa(xs_s + uint32_t(n * x_stride + c * 16), row + c, true);
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// s_part: [T][8] floats of shared memory.
template <typename TA>
__device__ __forceinline__ void stage_rms_norm_x(const void* x, int T, int64_t cols, int x_stride, const float* norm_w,
                                                 float eps, uint8_t* xs, float (*s_part)[8]) {
  stage_x_rows<TA>(x, T, cols, x_stride, xs);
  __syncthreads();
  if (!norm_w) return;
  if (blockDim.x != 256) __trap();  // rms_norm_vec_kernel's order needs 256 threads
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int E = 16 / sizeof(TA);
  const int nvec = int(cols) / E;
  for (int n = 0; n < T; ++n) {
    float ss = 0.f;
    for (int c = tid; c < nvec; c += 256) {
      float f[E];
      load16_f32<TA>(reinterpret_cast<const TA*>(xs + n * x_stride) + c * E, f);
#pragma unroll
      for (int e = 0; e < E; ++e) ss = fmaf(f[e], f[e], ss);
    }
    ss = warp_sum(ss);
    if (lane == 0) s_part[n][warp] = ss;
  }
  __syncthreads();
  for (int n = 0; n < T; ++n) {
    float tot = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) tot += s_part[n][i];
    const float inv = rsqrtf(tot / float(cols) + eps);
    for (int c = tid; c < nvec; c += 256) {
      TA* p = reinterpret_cast<TA*>(xs + n * x_stride) + c * E;
      float f[E], o[E];
      load16_f32<TA>(p, f);
#pragma unroll
      for (int e = 0; e < E; e += 4) {
        const float4 w4 = __ldg(reinterpret_cast<const float4*>(norm_w + c * E + e));
        o[e] = f[e] * inv * w4.x, o[e + 1] = f[e + 1] * inv * w4.y;
        o[e + 2] = f[e + 2] * inv * w4.z, o[e + 3] = f[e + 3] * inv * w4.w;
      }
      store16_f32<TA>(p, o);
    }
  }
  __syncthreads();
}

}  // namespace nf4flash::cuda
