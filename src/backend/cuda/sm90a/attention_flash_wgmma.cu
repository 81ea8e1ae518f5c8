// Launcher of the Hopper FlashAttention kernel (kernels/attention_flash_wgmma.cuh). Compiled for
// sm_90a with the fused GEMM (CMakeLists.txt); elsewhere attention_flash_wgmma_built() is false.
#include "backend/cuda/kernels/attention_flash_wgmma.cuh"
#include "backend/cuda/sm90a/tensor_map.h"

namespace nf4flash::cuda {

bool attention_flash_wgmma_built() {
#if defined(NF4FLASH_SM90A_BUILD)
  return true;
#else
  return false;
#endif
}

bool attention_flash_wgmma_supported() {
  static const bool ok = [] {
    int dev = 0, ma = 0, mi = 0;
    if (!attention_flash_wgmma_built() || cudaGetDevice(&dev) != cudaSuccess) return false;
    CUDA_CHECK(cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev));
    return ma == 9 && mi == 0;
  }();
  return ok;
}

// K and V of the layer as [n_kv * capacity, HD] 2D tensor maps, boxes of 64 columns x 128 rows with
// the 128-byte swizzle the kernel's descriptors expect.
void attention_flash_wgmma(const AttnArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(attention_flash_wgmma_supported(),
                 "attention_flash_wgmma: needs a compute capability 9.0 GPU and a build for sm_90a");
  NF4FLASH_CHECK(reinterpret_cast<uintptr_t>(a.k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v_cache) % 16 == 0,
                 "attention_flash_wgmma: K/V cache not 16-byte aligned");
  NF4FLASH_CHECK(a.q_stride % 2 == 0, "attention_flash_wgmma: q row stride must be even");
  if (a.T == 0) return;
  const bool bf = a.act == DType::BF16;
  const CUtensorMapDataType dt = bf ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const int64_t rows = int64_t(a.n_kv) * a.capacity;
  const CUtensorMap kmap = tensor_map_2d(dt, a.k_cache, a.head_dim, rows, a.head_dim * 2, 64, kFlashWgBK,
                                         CU_TENSOR_MAP_SWIZZLE_128B, "K cache");
  const CUtensorMap vmap = tensor_map_2d(dt, a.v_cache, a.head_dim, rows, a.head_dim * 2, 64, kFlashWgBK,
                                         CU_TENSOR_MAP_SWIZZLE_128B, "V cache");
  constexpr bool PP = true;  // the FA3 schedules (intra-warpgroup overlap + ping-pong)
  auto launch = [&](auto kernel, int hd) {
    const int smem = flash_wg_smem_bytes(hd, PP);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(unsigned(a.n_heads), unsigned((a.T + kFlashWgBQ - 1) / kFlashWgBQ));
    kernel<<<grid, kFlashWgThreads, smem, st>>>(kmap, vmap, a);
    CUDA_CHECK_LAUNCH();
  };
  if (a.head_dim == 64) {
    if (bf) launch(attn_flash_wgmma_kernel<__nv_bfloat16, 64, PP>, 64);
    else launch(attn_flash_wgmma_kernel<__half, 64, PP>, 64);
  } else {
    NF4FLASH_CHECK(a.head_dim == 128, "attention_flash_wgmma: head_dim ", a.head_dim, " (64 or 128)");
    if (bf) launch(attn_flash_wgmma_kernel<__nv_bfloat16, 128, PP>, 128);
    else launch(attn_flash_wgmma_kernel<__half, 128, PP>, 128);
  }
}

}  // namespace nf4flash::cuda
