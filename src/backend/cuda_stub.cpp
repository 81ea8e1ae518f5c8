// Built only when the CUDA backend is off (NF4FLASH_CUDA=OFF): says so instead of running slowly.
#include "backend/backend.h"
#include "core/error.h"

namespace nf4flash {

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) {
  fail("--device cuda: this nf4flash was built without CUDA (reconfigure with -DNF4FLASH_CUDA=ON and nvcc on PATH)");
}

int cuda_device_count() { return 0; }

}  // namespace nf4flash

// ---- device_info.h without CUDA ---------------------------------------------------------------
#include "backend/device_info.h"

namespace nf4flash {

bool built_with_cuda() { return false; }
std::string gpu_absent_reason() { return "built without CUDA (reconfigure with -DNF4FLASH_CUDA=ON and nvcc on PATH)"; }
std::vector<GpuInfo> query_gpus() { return {}; }
bool gpu_memory(int, size_t*, size_t*) { return false; }
void gpu_profiler_start() {}

}  // namespace nf4flash

// ---- parallel/nccl_group.h without CUDA -------------------------------------------------------
#include "parallel/nccl_group.h"

namespace nf4flash {

std::vector<uint8_t> nccl_unique_id() {
  fail("tensor parallel over NCCL: this nf4flash was built without CUDA (reconfigure with -DNF4FLASH_CUDA=ON)");
}

std::unique_ptr<Communicator> make_nccl_communicator(Backend&, int, int, const std::vector<uint8_t>&) {
  fail("tensor parallel over NCCL: this nf4flash was built without CUDA (reconfigure with -DNF4FLASH_CUDA=ON)");
}

}  // namespace nf4flash
