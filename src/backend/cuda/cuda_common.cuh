// Shared helpers of the CUDA backend: error checks with file:line, element-type traits
// (f32 / f16 / bf16 <-> float), warp reductions and the one dtype dispatch used by every launcher.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/cublas_api.h"
#include "backend/cuda/launchers.h"
#include "core/dtype.h"
#include "core/error.h"

namespace nf4flash::cuda {

#define CUDA_CHECK(expr)                                                                    \
  do {                                                                                      \
    cudaError_t err_ = (expr);                                                              \
    if (err_ != cudaSuccess)                                                                \
      ::nf4flash::fail("CUDA error at ", __FILE__, ":", __LINE__, ": ", #expr, ": ",       \
                       cudaGetErrorName(err_), " (", cudaGetErrorString(err_), ")");        \
  } while (0)

#define CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                      \
    cublasStatus_t st_ = (expr);                                                            \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::nf4flash::fail("cuBLAS error at ", __FILE__, ":", __LINE__, ": ", #expr, ": ",     \
                       ::nf4flash::cuda::cublas().status_name(st_), " (",                  \
                       ::nf4flash::cuda::cublas().status_string(st_), ")");                \
  } while (0)

// After every kernel launch: launch-configuration errors surface here, with the call site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// ---- element types -------------------------------------------------------------------------
template <typename T> __device__ __forceinline__ float to_f32(T v);
template <> __device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Eight 16-bit values packed in a uint4 -> floats.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
  const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_f32<T>(h[i]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Streaming 16-byte load that does not allocate in L1 (weights are read once per step).
__device__ __forceinline__ uint4 ld_stream_u4(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// ---- programmatic dependent launch (PDL, sm_90+) -------------------------------------------
// A kernel launched by launch_k() may start while the previous kernel in the stream still runs;
// it must call pdl_wait() before it reads anything an earlier kernel wrote or writes any global
// memory (what comes before: shared-memory setup, reads of weights). pdl_trigger() lets the next
// kernel start launching. Both are no-ops before sm_90 and for kernels launched without PDL.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Multiprocessors of the current device (queried once per process).
int device_sm_count();
// Compute capability major version of the current device (queried once per process).
int device_cc_major();

// The launch configuration of launch_k / launch_k_ptr: the programmatic-serialization attribute
// (stored in *attr) when pdl_enabled().
inline cudaLaunchConfig_t pdl_launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                            cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  attr->id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr->val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  return cfg;
}

// kernel<<<grid, block, smem, st>>>(args...) with the programmatic-serialization attribute when
// pdl_enabled(). Only for kernels that call pdl_wait() as described above.
template <typename... KArgs, typename... Args>
void launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(grid, block, smem, st, &attr);
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
// The same for a kernel given by address with its argument array (cudaLaunchKernel's form).
void launch_k_ptr(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t st, void** args);

// The first key a query of context length L sees: L - window under a sliding window, else 0
// (every attention kernel's window).
__host__ __device__ __forceinline__ int attn_first_key(int L, int window) {
  return window > 0 && L > window ? L - window : 0;
}

}  // namespace nf4flash::cuda

// Runtime dtype -> C++ type, exactly once per op: `F(T{})` is instantiated for the three
// activation types; anything else is refused by name.
#define NF4FLASH_DISPATCH_ACT(dtype, what, ...)                                               \
  [&] {                                                                                      \
    switch (dtype) {                                                                         \
      case ::nf4flash::DType::F32: { using T = float; return __VA_ARGS__(); }                 \
      case ::nf4flash::DType::F16: { using T = __half; return __VA_ARGS__(); }                \
      case ::nf4flash::DType::BF16: { using T = __nv_bfloat16; return __VA_ARGS__(); }        \
      default: ::nf4flash::fail(what, ": unsupported dtype ", ::nf4flash::dtype_name(dtype),  \
                                " on CUDA (supported: F32, F16, BF16)");                     \
    }                                                                                        \
  }()
