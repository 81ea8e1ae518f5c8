// Greedy token choice on the GPU: argmax over f32 logits [vocab] (first index on ties, NaN never
// wins), with transformers' repetition penalty applied to the history ids (each id once:
// penalized(l) = l < 0 ? l * p : l / p, read from the original logits so duplicates are idempotent).
// Two launches: kArgmaxBlocks partial (value, index) pairs, then one block reduces them.
#pragma once
#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

__device__ __forceinline__ void argmax_pair(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}

template <int NT>
__device__ __forceinline__ void block_argmax(float& v, int& i) {
  __shared__ float sv[NT / 32];
  __shared__ int si[NT / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, i, o);
    argmax_pair(v, i, v2, i2);
  }
  if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = v; si[threadIdx.x >> 5] = i; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < NT / 32; ++w) argmax_pair(v, i, sv[w], si[w]);
  }
}


// Pass 1 without penalty.
__global__ void __launch_bounds__(256) argmax_partial_kernel(const float* __restrict__ logits, int64_t vocab,
                                                             float* pv, int* pi) {
  pdl_trigger();
  pdl_wait();
  float v = -FLT_MAX;
  int idx = INT_MAX;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vocab; i += int64_t(gridDim.x) * blockDim.x) {
    const float l = logits[i];
    if (!(l != l)) argmax_pair(v, idx, l, int(i));
  }
  block_argmax<256>(v, idx);
  if (threadIdx.x == 0) { pv[blockIdx.x] = v; pi[blockIdx.x] = idx; }
}

// Pass 1 with penalty: every element checks membership in history (history is short; only used
// when repeat_penalty != 1).
__global__ void __launch_bounds__(256) argmax_partial_penalty_kernel(const float* __restrict__ logits, int64_t vocab,
                                                                     const int32_t* __restrict__ hist, int nh,
                                                                     float pen, float* pv, int* pi) {
  pdl_trigger();
  pdl_wait();
  __shared__ int32_t sh[1024];
  const int n_sh = nh < 1024 ? nh : 1024;
  for (int j = threadIdx.x; j < n_sh; j += blockDim.x) sh[j] = hist[j];
  __syncthreads();
  float v = -FLT_MAX;
  int idx = INT_MAX;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vocab; i += int64_t(gridDim.x) * blockDim.x) {
    float l = logits[i];
    bool in = false;
    for (int j = 0; j < n_sh && !in; ++j) in = sh[j] == i;
    for (int j = n_sh; j < nh && !in; ++j) in = hist[j] == i;
    if (in) l = l < 0.f ? l * pen : l / pen;
    if (!(l != l)) argmax_pair(v, idx, l, int(i));
  }
  block_argmax<256>(v, idx);
  if (threadIdx.x == 0) { pv[blockIdx.x] = v; pi[blockIdx.x] = idx; }
}

__global__ void __launch_bounds__(256) argmax_final_kernel(const float* pv, const int* pi, int n, int32_t* out) {
  pdl_trigger();
  pdl_wait();
  float v = -FLT_MAX;
  int idx = INT_MAX;
  for (int i = threadIdx.x; i < n; i += blockDim.x) argmax_pair(v, idx, pv[i], pi[i]);
  block_argmax<256>(v, idx);
  if (threadIdx.x == 0) out[0] = idx == INT_MAX ? 0 : idx;
}

// Greedy argmax of several rows (a batched step's logits [n, vocab]): grid (kArgmaxRowBlocks, n),
// each block a grid-stride share of row blockIdx.y -> (pv, pi)[row][block]; then one block per row
// reduces its partials into out[row]. Same result as argmax() of that row alone (ties: first index).
__global__ void __launch_bounds__(256) argmax_rows_partial_kernel(const float* __restrict__ logits, int64_t vocab,
                                                                  float* pv, int* pi) {
  const float* row = logits + int64_t(blockIdx.y) * vocab;
  float v = -FLT_MAX;
  int idx = INT_MAX;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vocab; i += int64_t(gridDim.x) * blockDim.x) {
    const float l = row[i];
    if (!(l != l)) argmax_pair(v, idx, l, int(i));
  }
  block_argmax<256>(v, idx);
  if (threadIdx.x == 0) {
    pv[blockIdx.y * gridDim.x + blockIdx.x] = v;
    pi[blockIdx.y * gridDim.x + blockIdx.x] = idx;
  }
}
__global__ void __launch_bounds__(256) argmax_rows_final_kernel(const float* pv, const int* pi, int n, int32_t* out) {
  float v = -FLT_MAX;
  int idx = INT_MAX;
  for (int i = threadIdx.x; i < n; i += blockDim.x) argmax_pair(v, idx, pv[blockIdx.x * n + i], pi[blockIdx.x * n + i]);
  block_argmax<256>(v, idx);
  if (threadIdx.x == 0) out[blockIdx.x] = idx == INT_MAX ? 0 : idx;
}

// The pipelined decode loop's hand-over (one thread): the sampled id becomes the next step's input
// id, the step position advances by one and, with a history (the repetition penalty's), the id is
// appended to it. Shapes: id, next_id, pos, hist_count one int32 each; hist [hist_cap] (device).
__global__ void decode_advance_kernel(const int32_t* id, int32_t* next_id, int32_t* pos, int32_t* hist,
                                      int32_t* hist_count, int hist_cap) {
  pdl_trigger();
  pdl_wait();
  if (threadIdx.x == 0) {
    const int32_t v = id[0];
    next_id[0] = v;
    pos[0] += 1;
    if (hist) {
      const int32_t c = hist_count[0];
      if (c < hist_cap) {
        hist[c] = v;
        hist_count[0] = c + 1;
      }
    }
  }
}

}  // namespace nf4flash::cuda
