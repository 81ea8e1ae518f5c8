// cublas() (cublas_api.h): dlopen + dlsym once.
#include "backend/cuda/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

#define NF4FLASH_STR2(x) #x
#define NF4FLASH_STR(x) NF4FLASH_STR2(x)  // after macro expansion: cublasCreate -> "cublasCreate_v2"

namespace nf4flash::cuda {
namespace {

CublasApi load() {
  const std::string name = "libcublas.so." NF4FLASH_STR(CUBLAS_VER_MAJOR);
  std::string why;
  void* h = open_cuda_library(name, why);
  if (!h)
    fail("CUDA backend: cannot load cuBLAS (", name, "): ", why,
         ". Install the CUDA toolkit's cuBLAS or add its library folder to LD_LIBRARY_PATH.");
  auto sym = [&](const char* s) {
    void* p = dlsym(h, s);
    if (!p) fail("CUDA backend: ", name, " has no ", s, " (a cuBLAS older than the headers this was built with?)");
    return p;
  };
  CublasApi a{};
#define NF4FLASH_CUBLAS_SYM(field, fn) a.field = reinterpret_cast<decltype(a.field)>(sym(NF4FLASH_STR(fn)))
  NF4FLASH_CUBLAS_SYM(create, cublasCreate);
  NF4FLASH_CUBLAS_SYM(destroy, cublasDestroy);
  NF4FLASH_CUBLAS_SYM(set_stream, cublasSetStream);
  NF4FLASH_CUBLAS_SYM(set_workspace, cublasSetWorkspace);
  NF4FLASH_CUBLAS_SYM(set_math_mode, cublasSetMathMode);
  NF4FLASH_CUBLAS_SYM(gemm_ex, cublasGemmEx);
  NF4FLASH_CUBLAS_SYM(gemm_strided_batched_ex, cublasGemmStridedBatchedEx);
  NF4FLASH_CUBLAS_SYM(status_name, cublasGetStatusName);
  NF4FLASH_CUBLAS_SYM(status_string, cublasGetStatusString);
#undef NF4FLASH_CUBLAS_SYM
  return a;  // the library stays loaded for the process
}

}  // namespace

void* open_cuda_library(const std::string& name, std::string& why) {
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  why = h ? "" : dlerror();
#ifdef NF4FLASH_CUDA_LIBRARY_DIR
  if (!h) {
    const std::string path = std::string(NF4FLASH_CUDA_LIBRARY_DIR) + "/" + name;
    h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) why += cat("; ", dlerror());
  }
#endif
  return h;
}

const CublasApi& cublas() {
  static const CublasApi api = load();
  return api;
}

}  // namespace nf4flash::cuda
