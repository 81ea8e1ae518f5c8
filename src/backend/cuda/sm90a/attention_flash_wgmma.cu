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

// K and V of the layer as [n_kv * capacity, HD] 2D tensor maps, boxes of 64 columns x BK rows
// (flash_wg_bk: 128, 64 at head_dim 256) with the 128-byte swizzle the kernel's descriptors expect;
// at head_dim 256 also q as a [T, q_stride] map, boxes of 64 columns x 64 rows.
void attention_flash_wgmma(const AttnArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(attention_flash_wgmma_supported(),
                 "attention_flash_wgmma: needs a compute capability 9.0 GPU and a build for sm_90a");
  NF4FLASH_CHECK(reinterpret_cast<uintptr_t>(a.k_cache) % 16 == 0 && reinterpret_cast<uintptr_t>(a.v_cache) % 16 == 0,
                 "attention_flash_wgmma: K/V cache not 16-byte aligned");
  NF4FLASH_CHECK(a.q_stride % 2 == 0, "attention_flash_wgmma: q row stride must be even");
  if (a.T == 0) return;
  const bool bf = a.act == DType::BF16;
  const CUtensorMapDataType dt = bf ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  NF4FLASH_CHECK(attention_flash_wgmma_head_dim(a.head_dim), "attention_flash_wgmma: head_dim ", a.head_dim,
                 " (64, 128 or 256)");
  const int64_t rows = int64_t(a.n_kv) * a.capacity;
  const uint32_t bk = uint32_t(flash_wg_bk(a.head_dim));
  const CUtensorMap kmap = tensor_map_2d(dt, a.k_cache, a.head_dim, rows, a.head_dim * 2, 64, bk,
                                         CU_TENSOR_MAP_SWIZZLE_128B, "K cache");
  const CUtensorMap vmap = tensor_map_2d(dt, a.v_cache, a.head_dim, rows, a.head_dim * 2, 64, bk,
                                         CU_TENSOR_MAP_SWIZZLE_128B, "V cache");
  CUtensorMap qmap = kmap;  // read only at head_dim 256
  if (a.head_dim > 128) {
    NF4FLASH_CHECK(reinterpret_cast<uintptr_t>(a.q) % 16 == 0 && a.q_stride % 8 == 0,
                   "attention_flash_wgmma: q must be 16-byte aligned with rows of a multiple of 8 elements");
    qmap = tensor_map_2d(dt, a.q, a.q_stride, a.T, a.q_stride * 2, 64, 64, CU_TENSOR_MAP_SWIZZLE_128B, "q");
  }
  constexpr bool PP = true;  // the FA3 schedules (intra-warpgroup overlap + ping-pong)
  auto launch = [&](auto kernel, int hd) {
    const int smem = flash_wg_smem_bytes(hd, PP);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const dim3 grid(unsigned(a.n_heads), unsigned((a.T + kFlashWgBQ - 1) / kFlashWgBQ));
    kernel<<<grid, kFlashWgThreads, smem, st>>>(kmap, vmap, qmap, a);
    CUDA_CHECK_LAUNCH();
  };
  switch (a.head_dim) {
    case 64: return bf ? launch(attn_flash_wgmma_kernel<__nv_bfloat16, 64, PP>, 64)
                       : launch(attn_flash_wgmma_kernel<__half, 64, PP>, 64);
    case 128: return bf ? launch(attn_flash_wgmma_kernel<__nv_bfloat16, 128, PP>, 128)
                        : launch(attn_flash_wgmma_kernel<__half, 128, PP>, 128);
    default: return bf ? launch(attn_flash_wgmma_kernel<__nv_bfloat16, 256, PP>, 256)
                       : launch(attn_flash_wgmma_kernel<__half, 256, PP>, 256);
  }
}

}  // namespace nf4flash::cuda
