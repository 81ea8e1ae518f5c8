// Programmatic dependent launch: whether it is used (pdl_enabled) and the launch by address; the
// empty-launch ablation (EmptyLaunches, kernel-bench only).
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

namespace {
thread_local bool t_empty = false;

// Shapes: any grid and block; no arguments, no memory touched.
__global__ void pdl_empty_kernel() {
  pdl_trigger();
  pdl_wait();
}
}  // namespace

bool empty_launches() { return t_empty; }

EmptyLaunches::EmptyLaunches(bool on) : prev_(t_empty) { t_empty = t_empty || on; }
EmptyLaunches::~EmptyLaunches() { t_empty = prev_; }

void launch_empty(dim3 grid, dim3 block, size_t smem, cudaStream_t st) {
  static const bool smem_set = [] {  // the largest dynamic shared memory any decode kernel asks for
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaFuncSetAttribute(pdl_empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
    return true;
  }();
  (void)smem_set;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(grid, block, smem, st, &attr);
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, pdl_empty_kernel));
}

void launch_k_ptr(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t st, void** args) {
  if (empty_launches()) return launch_empty(grid, block, smem, st);
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(grid, block, smem, st, &attr);
  CUDA_CHECK(cudaLaunchKernelExC(&cfg, kernel, args));
}

}  // namespace nf4flash::cuda
