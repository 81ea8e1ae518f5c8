// Softmax of the eager attention path (materialized scores; see launchers.h "Eager").
//
// attn_eager_softmax_kernel<TP>: s [heads][rows][L] f32 raw scores (Q K^T, unscaled) ->
//   p [heads][rows][L] in TP (the compute dtype, as transformers casts the f32 softmax back to the
//   query dtype). Row r of the chunk is query row row0 + r of the step, absolute position
//   pos0 + row0 + r (pos0 from device memory, so a captured graph stays valid); columns past that
//   position (causal, and the unwritten cache tail when L is the capacity) and, with a sliding
//   window, keys at or before position - window get probability 0; soft-capped scores
//   (AttnArgs::softcap) are capped before the softmax.
//   grid (rows, heads), 256 threads: block max, then sum of exp2((s - max) * scale * log2 e),
//   then the normalized write; three passes over the row (L2/L1-resident).
#pragma once
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

__device__ __forceinline__ float block_reduce(float v, bool is_max, float* sh) {
  v = is_max ? warp_max(v) : warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // sh may still be read from a previous reduction
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.f;
  for (int w = 0; w < nw; ++w) r = is_max ? fmaxf(r, sh[w]) : r + sh[w];
  return r;
}

template <typename TP>
__global__ void __launch_bounds__(256) attn_eager_softmax_kernel(const EagerSoftmaxArgs a) {
  __shared__ float sh[32];
  const int r = blockIdx.x, hl = blockIdx.y;
  const int64_t off = (int64_t(hl) * a.rows + r) * a.L;
  const float* s = a.s + off;
  TP* p = static_cast<TP*>(a.p) + off;
  const int64_t qpos = int64_t(a.pos0[0]) + a.row0 + r;
  const int64_t valid = qpos + 1 < a.L ? qpos + 1 : a.L;
  const int64_t lo = a.window > 0 && qpos + 1 > a.window ? qpos + 1 - a.window : 0;  // first visible key
  // soft-capped: score cap * tanh(s * scale / cap), then base 2
  const bool capped = a.softcap > 0.f;
  const float sl2 = capped ? 1.4426950408889634f : a.scale * 1.4426950408889634f;
  auto score = [&](int64_t j) { return capped ? a.softcap * tanhf(s[j] * a.scale / a.softcap) : s[j]; };
  float mx = -INFINITY;
  for (int64_t j = lo + threadIdx.x; j < valid; j += blockDim.x) mx = fmaxf(mx, score(j));
  mx = block_reduce(mx, true, sh);
  const float base = mx * sl2;
  float sum = 0.f;
  for (int64_t j = lo + threadIdx.x; j < valid; j += blockDim.x) sum += exp2f(fmaf(score(j), sl2, -base));
  sum = block_reduce(sum, false, sh);
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int64_t j = threadIdx.x; j < a.L; j += blockDim.x)
    p[j] = from_f32<TP>(j >= lo && j < valid ? exp2f(fmaf(score(j), sl2, -base)) * inv : 0.f);
}

}  // namespace nf4flash::cuda
