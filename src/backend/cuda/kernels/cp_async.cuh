// cp.async (sm_80+) helpers: 16- and 4-byte global -> shared copies that zero-fill when the predicate is
// false, commit and wait on groups. Used by the ring GEMV and the 4-bit GEMMs.
#pragma once
#include <cstdint>

namespace nf4flash::cuda {

__device__ __forceinline__ void cp_async16_sa(uint32_t smem_addr, const void* gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool pred) {
  cp_async16_sa(static_cast<uint32_t>(__cvta_generic_to_shared(smem)), gmem, pred);
}
// 4-byte copy through L1 (cp.async.ca), zero-filled when pred is false: gathers of 4-byte units.
__device__ __forceinline__ void cp_async4_sa(uint32_t smem_addr, const void* gmem, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(pred ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace nf4flash::cuda
