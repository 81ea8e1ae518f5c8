// Launch settings shared by every launcher: programmatic dependent launch (pdl_enabled) and the
// current device's multiprocessor count and compute capability.
#include <atomic>

#include "backend/cuda/cuda_common.cuh"

namespace nf4flash::cuda {

namespace {
std::atomic<bool> g_pdl_requested{true};

int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, v = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
  return v;
}
}  // namespace

int device_sm_count() {
  static const int n = device_attribute(cudaDevAttrMultiProcessorCount);
  return n;
}

int device_cc_major() {
  static const int m = device_attribute(cudaDevAttrComputeCapabilityMajor);
  return m;
}

void set_pdl_requested(bool on) { g_pdl_requested.store(on, std::memory_order_relaxed); }

bool pdl_enabled() { return g_pdl_requested.load(std::memory_order_relaxed) && device_cc_major() >= 9; }

void launch_k_ptr(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t st, void** args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(grid, block, smem, st, &attr);
  CUDA_CHECK(cudaLaunchKernelExC(&cfg, kernel, args));
}

}  // namespace nf4flash::cuda
