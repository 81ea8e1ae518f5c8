// Device memory and uploaded weights of the CUDA backend (cuda_backend_impl.h): buffers
// (cudaMalloc, pinned mapped host memory), the dense and 4-bit weight types with their device
// layouts, the VRAM trace, and the small host helpers the upload code uses (element load/store by
// dtype, powers of two, cuBLAS data types).
#pragma once
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda_impl {

using namespace cuda;

// CudaTuning::vram_trace (set when a backend is created; process-wide): device memory in use
// (total - free, all of the GPU) after each step of the backend's setup and after each allocation
// of >= 8 MiB, on stderr (where peak VRAM goes).
inline std::atomic<bool>& vram_trace_on() {
  static std::atomic<bool> on{false};
  return on;
}
inline void vram_trace(const char* what, size_t bytes = 0) {
  if (!vram_trace_on().load(std::memory_order_relaxed)) return;
  size_t f = 0, t = 0;
  if (cudaMemGetInfo(&f, &t) != cudaSuccess) return;
  std::fprintf(stderr, "vram: %-28s %+9.1f MiB  used %.3f GiB\n", what, double(bytes) / (1 << 20),
               double(t - f) / double(1 << 30));
}

class CudaBuffer : public Buffer {
 public:
  explicit CudaBuffer(size_t bytes) {
    bytes_ = bytes;
    if (bytes) CUDA_CHECK(cudaMalloc(&data_, bytes));
    if (bytes >= (size_t(8) << 20)) vram_trace("buffer", bytes);
  }
  ~CudaBuffer() override {
    if (data_) cudaFree(data_);
  }
};

// Pinned, mapped host memory (reachable from kernels through unified addressing).
class CudaHostBuffer : public Buffer {
 public:
  explicit CudaHostBuffer(size_t bytes) {
    bytes_ = bytes;
    if (bytes) CUDA_CHECK(cudaHostAlloc(&data_, bytes, cudaHostAllocMapped));
  }
  ~CudaHostBuffer() override {
    if (data_) cudaFreeHost(data_);
  }
};

class CudaDense : public Weight {
 public:
  CudaDense(DType dt, int64_t rows, int64_t cols) {
    kind_ = Kind::Dense;
    dtype_ = dt;
    rows_ = rows;
    cols_ = cols;
  }
  // resident_bytes(): GPU memory only (a host-resident table counts 0)
  void set_size() { bytes_ = (data && !on_host ? data->bytes() : 0) + (f32 ? f32->bytes() : 0); }
  std::unique_ptr<Buffer> data;
  bool on_host = false;
  std::unique_ptr<CudaBuffer> f32;  // vectors (norm weights, biases): an f32 copy for the kernels
};

class CudaQ4 : public Weight {
 public:
  explicit CudaQ4(const Quant4Tensor& q) {
    kind_ = Kind::Quant4;
    dtype_ = q.orig_dtype;
    quant_ = q.type;
    double_quant_ = q.double_quant;
    rows_ = q.rows;
    cols_ = q.cols;
  }
  Q4Device dev;
  std::unique_ptr<CudaBuffer> tiles, absmax, nested_absmax, nested_code;
  void set_bytes(size_t b) { bytes_ = b; }
  std::unique_ptr<CudaDense> fallback;  // dequantized at load when the tiled layout cannot hold it
  std::string fallback_why;
  std::vector<float> nested_code_host;  // double quant: to tell whether two weights can share a launch
};

inline const CudaDense& as_dense(const Weight& w, const char* what) {
  auto* d = dynamic_cast<const CudaDense*>(&w);
  NF4FLASH_CHECK(d, what, ": expected a dense CUDA weight");
  return *d;
}
inline const float* vec_f32(const Weight& w, int64_t n, const char* what) {
  const CudaDense& d = as_dense(w, what);
  NF4FLASH_CHECK(d.f32 && d.rows() * d.cols() == n, what, ": vector of ", n, " entries expected, got [",
                 d.rows(), ", ", d.cols(), "]");
  return static_cast<const float*>(d.f32->data());
}

inline bool is_pow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
inline int ilog2(int64_t v) { int r = 0; while ((int64_t(1) << r) < v) ++r; return r; }

inline cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: fail("cuBLAS: unsupported dtype ", dtype_name(t));
  }
}

}  // namespace nf4flash::cuda_impl
