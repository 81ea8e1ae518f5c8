// CUDA implementation of the GPU half of backend/device_info.h: plain C++ over the CUDA runtime
// API (compiled only in CUDA builds). Never throws: a missing driver or device gives no GPUs.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "backend/device_info.h"

namespace nf4flash {
namespace {

std::string cuda_version_string(int v) {  // 12040 -> "12.4"
  if (v <= 0) return "";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

// "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  ..." -> "570.86.15"
std::string nvidia_kernel_driver_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  const auto k = line.find("Kernel Module");
  if (k == std::string::npos) return "";
  std::istringstream ss(line.substr(k + 13));
  std::string v;
  ss >> v;
  return v;
}

}  // namespace

bool built_with_cuda() { return true; }

std::string gpu_absent_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  return n > 0 ? "" : "no CUDA device found";
}

std::vector<GpuInfo> query_gpus() {
  std::vector<GpuInfo> out;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return out;
  }
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  const std::string kdrv = nvidia_kernel_driver_version();
  int prev = 0;
  cudaGetDevice(&prev);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    GpuInfo g;
    g.index = i;
    g.name = p.name;
    g.cc_major = p.major;
    g.cc_minor = p.minor;
    g.total_bytes = p.totalGlobalMem;
    g.sm_count = p.multiProcessorCount;
    g.driver_version = kdrv;
    g.driver_cuda_version = cuda_version_string(drv);
    g.runtime_version = cuda_version_string(rt);
    g.bf16 = p.major >= 8;
    g.tf32 = p.major >= 8;
    size_t f = 0, t = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&f, &t) == cudaSuccess) {
      g.free_bytes = f;
      g.total_bytes = t;
    } else {
      cudaGetLastError();
    }
    out.push_back(g);
  }
  cudaSetDevice(prev);
  return out;
}

void gpu_profiler_start() {
  if (cudaProfilerStart() != cudaSuccess) cudaGetLastError();
}

bool gpu_memory(int index, size_t* free_bytes, size_t* total_bytes) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || index < 0 || index >= n) {
    cudaGetLastError();
    return false;
  }
  int prev = 0;
  cudaGetDevice(&prev);
  size_t f = 0, t = 0;
  bool ok = cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&f, &t) == cudaSuccess;
  if (!ok) cudaGetLastError();
  cudaSetDevice(prev);
  if (ok) {
    *free_bytes = f;
    *total_bytes = t;
  }
  return ok;
}

}  // namespace nf4flash
