// What hardware is there: CUDA devices (name, compute capability, memory, driver/runtime versions,
// bf16/TF32 support) and the host (CPU model, cores, memory, resident-set size). Used by `bench`
// (recorded in its JSON) and `doctor`. The GPU half is implemented in src/backend/cuda/device_info.cpp
// (CUDA builds) or src/backend/cuda_stub.cpp (no CUDA: no GPUs); the host half in
// src/bench/bench_host.cpp. None of these functions throw.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace nf4flash {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  size_t total_bytes = 0, free_bytes = 0;
  std::string driver_version;       // NVIDIA kernel driver, e.g. "570.86.15" ("" when unknown)
  std::string driver_cuda_version;  // CUDA version the driver supports, e.g. "12.8"
  std::string runtime_version;      // CUDA runtime nf4flash was built with, e.g. "12.6"
  int sm_count = 0;
  bool bf16 = false;  // bf16 tensor cores (sm_80+)
  bool tf32 = false;  // TF32 tensor cores (sm_80+)
};

// Every CUDA device the runtime can see; empty without CUDA, driver or devices.
std::vector<GpuInfo> query_gpus();
// cudaMemGetInfo on device `index`; false when there is no such device (or no CUDA).
bool gpu_memory(int index, size_t* free_bytes, size_t* total_bytes);
// cudaProfilerStart: a profiler attached with its collection off from the start (ncu / nsys
// --profile-from-start off) records from here on; nothing without one (or without CUDA).
void gpu_profiler_start();
// Whether this binary was built with the CUDA backend, and why no GPU is visible when none is
// ("" when at least one is, else e.g. "built without CUDA" / "cudaGetDeviceCount: no CUDA-capable device").
bool built_with_cuda();
std::string gpu_absent_reason();

struct HostInfo {
  std::string cpu_model;      // /proc/cpuinfo "model name" ("unknown" elsewhere)
  int logical_cores = 0;
  size_t mem_total_bytes = 0, mem_available_bytes = 0;
  std::string os;             // uname: sysname release machine
  std::string simd;           // compiled-in SIMD: "avx512" | "avx2+fma" | "none"
};
HostInfo query_host();

// Resident-set size of this process now / its peak so far (bytes; 0 when unknown).
size_t host_rss_bytes();
size_t host_peak_rss_bytes();
// Resets the peak RSS counter (Linux /proc/self/clear_refs "5"); false when not possible.
bool host_reset_peak_rss();

}  // namespace nf4flash
