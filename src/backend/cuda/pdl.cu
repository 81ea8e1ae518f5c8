// Programmatic dependent launch: whether it is used (pdl_enabled) and the launch by address.
#include <cstdlib>
#include <string_view>

#include "backend/cuda/cuda_common.cuh"

namespace nf4flash::cuda {

bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("NF4FLASH_PDL");
    if (e && std::string_view(e) == "0") return false;
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return on;
}

void launch_k_ptr(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t st, void** args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(grid, block, smem, st, &attr);
  CUDA_CHECK(cudaLaunchKernelExC(&cfg, kernel, args));
}

}  // namespace nf4flash::cuda
