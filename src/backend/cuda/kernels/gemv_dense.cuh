// Dense GEMV for few rows (decode): out[n, r] = sum_k x[n, k] * W[r, k] (+ bias[r]), n < T <= 8,
// or with residual: out[n, r] += that sum, rounded (o_proj / down_proj with the residual add).
// W: [N, K] row-major (bf16/f16/f32 storage), x: [T, K] compute dtype, out: compute dtype or f32.
// One warp per output row (8 rows per 256-thread block, grid-stride); f32 accumulation.
// gemv_dense_stream_kernel: the same rows and sums with the next batch loaded before the current
// one is summed (opt-in, NF4FLASH_DENSE_STREAM=4|8: measured slower end to end on the H200).
// Vector path (16-bit W and x, K % 8 == 0): 16-byte streaming loads of W (L1 no-allocate; read
// once per step) and 16-byte cached loads of x (reused by every row); four loads in flight per lane.
// In a captured decode step the vector kernel prefetches the weights ahead into L2 (a.pf; a unit =
// one block's 8 rows; kernels/l2_prefetch.cuh).
#pragma once
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels/l2_prefetch.cuh"

namespace nf4flash::cuda {

struct DenseKernelArgs {
  const void* w;
  int64_t N, K;
  const void* x;
  int T;
  const float* bias;
  void* out;
  int out_f32;
  const L2PfLaunch* pf;  // null: no prefetch
  int residual;          // out += round(x W^T + b) (out in the compute dtype), rounded as add()
};

template <typename TA>
__device__ __forceinline__ void gemv_store(const DenseKernelArgs& a, int n, int64_t row, float v) {
  if (a.bias) v += a.bias[row];
  if (a.out_f32) {
    static_cast<float*>(a.out)[n * a.N + row] = v;
  } else if (a.residual) {
    TA* p = static_cast<TA*>(a.out) + n * a.N + row;
    *p = from_f32<TA>(to_f32<TA>(*p) + to_f32<TA>(from_f32<TA>(v)));
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
  __shared__ __align__(16) L2PfLaunch s_pf[kPfLook];
  if (a.pf) {
    l2pf_load(a.pf, s_pf);
    __syncthreads();
  }
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t K8 = a.K / 8, units = (a.N + 7) / 8;
  for (int64_t row = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5); row < a.N; row += int64_t(gridDim.x) * 8) {
    if (a.pf && threadIdx.x == 0) l2pf_unit(s_pf, row >> 3, units);
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

// The vector kernel's rows and arithmetic (one warp per row, grid-stride; lane l sums chunks l,
// l + 32, ... in that order: every output is bit for bit gemv_dense_vec_kernel's), with the warp's
// chunks of all its rows as one stream: the next batch of U chunks per lane is loaded before the
// current one is summed, across row boundaries, so 2U loads of 16 bytes per lane are in flight
// while the vector kernel waits for each batch of 4 (opt-in: bf16 decode @512 measured 210 against
// 213 tok/s with the vector kernel, H200, tenth session). Why it was tried: ncu on the bf16 model's decode step
// (H200) had o_proj (4096 x 4096) and down_proj (4096 x 14336) at 2.3 and 2.7 TB/s through the
// vector kernel: one wave of 31 warps per SM, each waiting for 4 (o) or 14 (down) round trips in
// turn, while the same kernel streams lm_head (128256 rows, many waves) at the copy ceiling.
template <typename TW, typename TA, int TN, int U>
__global__ void __launch_bounds__(256) gemv_dense_stream_kernel(const DenseKernelArgs a) {
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int64_t K8 = a.K / 8, NB = (K8 + 32 * U - 1) / (32 * U);  // batches per row
  const int64_t step = int64_t(gridDim.x) * 8;
  int64_t lrow = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5), lb = 0;  // load cursor
  auto load = [&](uint4* wv) {
    if (lrow < a.N) {
      const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const TW*>(a.w) + lrow * a.K);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = lb * (32 * U) + 32 * u + lane;
        if (c < K8) wv[u] = ld_stream_u4(wr + c);
      }
    }
    if (++lb == NB) {
      lb = 0;
      lrow += step;
    }
  };
  int64_t row = lrow, b = 0;  // compute cursor
  if (row >= a.N) return;
  uint4 wv[2][U];
  load(wv[0]);
  float acc[TN];
#pragma unroll
  for (int n = 0; n < TN; ++n) acc[n] = 0.f;
  for (;;) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      load(wv[s ^ 1]);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t c = b * (32 * U) + 32 * u + lane;
        if (c < K8) dense_chunk<TW, TA, TN>(a, wv[s][u], c, acc);
      }
      if (++b == NB) {  // warp-uniform
#pragma unroll
        for (int n = 0; n < TN; ++n) {
          if (n < a.T) {
            const float v = warp_sum(acc[n]);
            if (lane == 0) gemv_store<TA>(a, n, row, v);
          }
          acc[n] = 0.f;
        }
        b = 0;
        row += step;
        if (row >= a.N) return;
      }
    }
  }
}

// One row per 256-thread block (grid-stride over rows): warp w, lane l take chunks
// 256 i + 32 w + l of the row (each step of the block reads 4 KB of the row contiguously), all of
// a lane's chunks loaded before any is summed (up to 8; more in further rounds), then the warp
// sums and the 8 warps' sums in warp order. Every SM keeps up to 8 rows x 4 KB per round in
// flight where the vec kernel keeps 31 warps x 2 KB. Sums in a different order than the vec
// kernel (not bit-identical). Default for long rows (K >= 8192, e.g. down_proj; ops_gemv.cu).
template <typename TW, typename TA, int TN>
__global__ void __launch_bounds__(256) gemv_dense_split_kernel(const DenseKernelArgs a) {
  __shared__ float red[8][TN];
  pdl_trigger();
  pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t K8 = a.K / 8;
  for (int64_t row = blockIdx.x; row < a.N; row += gridDim.x) {
    const uint4* wr = reinterpret_cast<const uint4*>(static_cast<const TW*>(a.w) + row * a.K);
    float acc[TN];
#pragma unroll
    for (int n = 0; n < TN; ++n) acc[n] = 0.f;
    for (int64_t c0 = threadIdx.x; c0 < K8; c0 += 256 * 8) dense_batch<TW, TA, TN, 8, 256>(a, wr, c0, K8, acc);
#pragma unroll
    for (int n = 0; n < TN; ++n) {
      const float v = warp_sum(acc[n]);
      if (lane == 0) red[warp][n] = v;
    }
    __syncthreads();
    if (threadIdx.x < a.T) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) v += red[w][threadIdx.x];
      gemv_store<TA>(a, int(threadIdx.x), row, v);
    }
    __syncthreads();
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
