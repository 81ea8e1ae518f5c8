// Dense GEMV for few rows (decode): out[n, r] = sum_k x[n, k] * W[r, k] (+ bias[r]), n < T <= 8.
// W: [N, K] row-major (bf16/f16/f32 storage), x: [T, K] compute dtype, out: compute dtype or f32.
// One warp per output row (8 rows per 256-thread block, grid-stride); f32 accumulation.
// Vector path (16-bit W and x, K % 8 == 0, 16-byte aligned): 16-byte streaming loads of W (L1
// no-allocate; read once per step) and 16-byte cached loads of x (reused by every row); four loads
// in flight per lane. Scalar path: everything else.
#pragma once
#include "backend/cuda/cuda_common.cuh"

namespace nf4flash::cuda {

struct DenseKernelArgs {
  const void* w;
  int64_t N, K;
  const void* x;
  int T;
  const float* bias;
  void* out;
  int out_f32;
};

template <typename TA>
__device__ __forceinline__ void gemv_store(const DenseKernelArgs& a, int n, int64_t row, float v) {
  if (a.bias) v += a.bias[row];
  if (a.out_f32) {
    static_cast<float*>(a.out)[n * a.N + row] = v;
  } else {
    static_cast<TA*>(a.out)[n * a.N + row] = from_f32<TA>(v);
  }
}

// One 16-byte chunk c of a dense GEMV row's sum for token n: xf = x[n, 8c .. 8c+7] (through L1),
// then acc += w[0..7] * xf in index order. Both dense decode kernels (this file's and
// gemv_dense_multi.cuh) use these, so a row's result is the same whichever kernel computes it.
template <typename TA>
__device__ __forceinline__ void dense_x8(const void* x, int64_t K, int n, int64_t c, float* xf) {
  unpack8<TA>(__ldg(reinterpret_cast<const uint4*>(static_cast<const TA*>(x) + n * K) + c), xf);
}
__device__ __forceinline__ float dense_dot8(const float* wf, const float* xf, float acc) {
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(wf[i], xf[i], acc);
  return acc;
}

// Chunk c of a row (its 16 bytes wq) into the token sums acc[n], n < T (dense_x8 + dense_dot8).
template <typename TW, typename TA, int TN>
__device__ __forceinline__ void dense_chunk(const DenseKernelArgs& a, const uint4& wq, int64_t c, float* acc) {
  float wf[8];
  unpack8<TW>(wq, wf);
#pragma unroll
  for (int n = 0; n < TN; ++n) {
    if (n < a.T) {
      float xf[8];
      dense_x8<TA>(a.x, a.K, n, c, xf);
      acc[n] = dense_dot8(wf, xf, acc[n]);
    }
  }
}

// One batch of a row's chunks: the B chunks c0 + S u (u < B, those below K8) of row wr all loaded
// (streaming), then summed in u order (dense_chunk).
template <typename TW, typename TA, int TN, int B, int S>
__device__ __forceinline__ void dense_batch(const DenseKernelArgs& a, const uint4* wr, int64_t c0, int64_t K8, float* acc) {
  uint4 wv[B];
#pragma unroll
  for (int u = 0; u < B; ++u)
    if (c0 + S * u < K8) wv[u] = ld_stream_u4(wr + c0 + S * u);
#pragma unroll
  for (int u = 0; u < B; ++u)
    if (c0 + S * u < K8) dense_chunk<TW, TA, TN>(a, wv[u], c0 + S * u, acc);
}

template <typename TW, typename TA, int TN>
__global__ void __launch_bounds__(256) gemv_dense_vec_kernel(const DenseKernelArgs a) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t K8 = a.K / 8;
  for (int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5); row < a.N; row += int64_t(gridDim.x) * 8) {
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const TW*>(a.w) + row * a.K);
    float acc[TN];
#pragma unroll
    for (int n = 0; n < TN; ++n) acc[n] = 0.f;
    for (int64_t c0 = lane; c0 < K8; c0 += 32 * 4) dense_batch<TW, TA, TN, 4, 32>(a, wr, c0, K8, acc);
#pragma unroll
    for (int n = 0; n < TN; ++n) {
      if (n < a.T) {
        const float v = warp_sum(acc[n]);
        if (lane == 0) gemv_store<TA>(a, n, row, v);
      }
    }
  }
}

template <typename TW, typename TA>
__global__ void __launch_bounds__(256) gemv_dense_scalar_kernel(const DenseKernelArgs a) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  for (int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5); row < a.N; row += int64_t(gridDim.x) * 8) {
    const TW* wr = static_cast<const TW*>(a.w) + row * a.K;
    for (int n = 0; n < a.T; ++n) {
      const TA* xr = static_cast<const TA*>(a.x) + n * a.K;
      float acc = 0.f;
      for (int64_t k = lane; k < a.K; k += 32) acc = fmaf(to_f32<TW>(wr[k]), to_f32<TA>(xr[k]), acc);
      acc = warp_sum(acc);
      if (lane == 0) gemv_store<TA>(a, n, row, acc);
    }
  }
}

}  // namespace nf4flash::cuda
