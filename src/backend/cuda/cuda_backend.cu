// The CUDA Backend: one device, one non-blocking stream, plain cudaMalloc per buffer, cuBLAS for
// many-row products, CUDA graphs over the stream (class in cuda_backend_impl.h, linear dispatch in
// cuda_linear.cu). Every CUDA/cuBLAS call is checked with file:line.
#include "backend/cuda/cuda_backend_impl.h"

namespace nf4flash {

using cuda_impl::CudaBackend;

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& o) {
  const int n = cuda_device_count();
  NF4FLASH_CHECK(n > 0, "--device cuda: no usable CUDA device (driver missing or no GPU)");
  NF4FLASH_CHECK(o.device_index >= 0 && o.device_index < n, "--device cuda: device index ", o.device_index,
                 " out of range (", n, " devices)");
  return std::make_unique<CudaBackend>(o);
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace nf4flash
