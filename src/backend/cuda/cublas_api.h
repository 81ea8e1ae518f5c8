// cuBLAS, loaded when the first CUDA backend is created rather than linked: libcublas and
// libcublasLt run static initializers when they are loaded (about 70 ms and 225 MB of resident
// memory at every start of the binary, measured with `nf4flash --version` on a 2-core EPYC), which
// CPU runs and commands without a GPU (tokenize, --help) do not need. The functions the backend
// calls, by their cublas_v2.h names.
#pragma once
#include <cublas_v2.h>

#include <string>

namespace nf4flash::cuda {

// dlopen of a CUDA library by its soname, then from the toolkit's library folder this was built
// against; null with `why` (both dlerror texts) when neither loads.
void* open_cuda_library(const std::string& name, std::string& why);

// The C functions of the two GEMMs (the header adds C++ overloads with a cudaDataType compute type).
using CublasGemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                          const void*, const void*, cudaDataType, int, const void*, cudaDataType, int,
                                          const void*, void*, cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
using CublasGemmStridedBatchedExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                                        int, const void*, const void*, cudaDataType, int, long long int,
                                                        const void*, cudaDataType, int, long long int, const void*,
                                                        void*, cudaDataType, int, long long int, int,
                                                        cublasComputeType_t, cublasGemmAlgo_t);

struct CublasApi {
  decltype(&cublasCreate) create;
  decltype(&cublasDestroy) destroy;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasSetWorkspace) set_workspace;
  decltype(&cublasSetMathMode) set_math_mode;
  CublasGemmExFn gemm_ex;
  CublasGemmStridedBatchedExFn gemm_strided_batched_ex;
  decltype(&cublasGetStatusName) status_name;
  decltype(&cublasGetStatusString) status_string;
};

// Loads libcublas.so.<major> (the loader's search path, then the CUDA toolkit's library folder the
// build used) on first use; throws Error naming the library and the loader's message when it
// cannot. Thread-safe.
const CublasApi& cublas();

}  // namespace nf4flash::cuda
