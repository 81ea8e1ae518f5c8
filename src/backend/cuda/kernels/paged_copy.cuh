// The copies of a paged step (launchers: ops_paged.cu): a sequence's K/V out of its blocks into the
// contiguous layout of the prompt kernels, and the rows of a step that give logits.
#pragma once
#include "backend/cuda/kernels/paged.cuh"

namespace nf4flash::cuda {

// paged_gather_kv_kernel: positions [0, len) of sequence `seq` from the paged caches of one layer
// (src [n_kv][src_capacity][hd]) into contiguous caches dst [n_kv][dst_capacity][hd], 16 bytes per
// thread (hd * sizeof(T) is a multiple of 16). Grid-stride over n_kv * len * chunks.
template <typename T>
__global__ void paged_gather_kv_kernel(const T* k_src, const T* v_src, int64_t src_capacity, const PagedRows p,
                                       int seq, int len, T* k_dst, T* v_dst, int64_t dst_capacity, int n_kv, int hd) {
  const int chunks = hd * int(sizeof(T)) / 16;
  const int64_t total = int64_t(n_kv) * len * chunks;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % chunks);
    const int pos = int((i / chunks) % len);
    const int h = int(i / (int64_t(chunks) * len));
    const int64_t src = (int64_t(h) * src_capacity + paged_slot(p, seq, pos)) * hd;
    const int64_t dst = (int64_t(h) * dst_capacity + pos) * hd;
    reinterpret_cast<uint4*>(k_dst + dst)[c] = reinterpret_cast<const uint4*>(k_src + src)[c];
    reinterpret_cast<uint4*>(v_dst + dst)[c] = reinterpret_cast<const uint4*>(v_src + src)[c];
  }
}

// gather_rows_kernel: out[i, :] = x[rows[i], :], i < n, rows of `bytes` bytes (a multiple of 16).
__global__ void gather_rows_kernel(const uint4* x, const int32_t* rows, uint4* out, int64_t n, int64_t vecs) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n * vecs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / vecs, c = i % vecs;
    out[i] = x[int64_t(rows[r]) * vecs + c];
  }
}

}  // namespace nf4flash::cuda
