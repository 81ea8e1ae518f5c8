// Launchers of the paged-step copies (kernels/paged.cuh): a sequence's K/V gathered out of its
// blocks for the prompt attention kernels, and the rows of a step that give logits.
#include "backend/cuda/kernels/paged_copy.cuh"

#include <algorithm>

#include "backend/cuda/cuda_common.cuh"

namespace nf4flash::cuda {

void paged_gather_kv(const void* k_src, const void* v_src, int64_t src_capacity, const PagedRows& p, int seq,
                     int len, void* k_dst, void* v_dst, int64_t dst_capacity, int n_kv, int head_dim,
                     DType kv_dtype, cudaStream_t st) {
  NF4FLASH_CHECK(seq >= 0 && seq < p.n_seqs && len >= 0 && len <= dst_capacity, "paged_gather_kv: sequence ", seq,
                 " length ", len, " (capacity ", dst_capacity, ")");
  NF4FLASH_CHECK(head_dim * dtype_size(kv_dtype) % 16 == 0, "paged_gather_kv: rows must be multiples of 16 bytes");
  if (len == 0) return;
  const int64_t n = int64_t(n_kv) * len * (head_dim * int64_t(dtype_size(kv_dtype)) / 16);
  const unsigned grid = unsigned(std::min<int64_t>((n + 255) / 256, 4096));
  auto run = [&](auto tag) {
    using T = decltype(tag);
    paged_gather_kv_kernel<T><<<grid, 256, 0, st>>>(static_cast<const T*>(k_src), static_cast<const T*>(v_src),
                                                     src_capacity, p, seq, len, static_cast<T*>(k_dst),
                                                     static_cast<T*>(v_dst), dst_capacity, n_kv, head_dim);
  };
  if (kv_dtype == DType::F32) run(float{});
  else run(uint16_t{});  // bf16 / f16: copied as 16-bit words
  CUDA_CHECK_LAUNCH();
}

void gather_rows(const void* x, const int32_t* rows, void* out, int64_t n_out, int64_t cols, size_t es,
                 cudaStream_t st) {
  const int64_t bytes = cols * int64_t(es);
  NF4FLASH_CHECK(bytes % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0,
                 "gather_rows: rows must be 16-byte multiples at 16-byte addresses");
  if (n_out == 0) return;
  const int64_t vecs = bytes / 16;
  const unsigned grid = unsigned(std::min<int64_t>((n_out * vecs + 255) / 256, 4096));
  gather_rows_kernel<<<grid, 256, 0, st>>>(static_cast<const uint4*>(x), rows, static_cast<uint4*>(out), n_out, vecs);
  CUDA_CHECK_LAUNCH();
}

}  // namespace nf4flash::cuda
