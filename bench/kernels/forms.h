// What the kernel benchmark's forms sections (decode_forms.cu, skinny_forms.cu) share: the backend's
// stream, copies of a random nf4-dq weight, the tiled 4-bit device weight behind an uploaded Weight,
// and the one-line list of the forms that differed.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_resources.h"
#include "bench.h"
#include "core/error.h"

namespace nf4flash::kbench {

// The CUDA stream of the benchmark's backend (`section` names the caller in the error).
inline cudaStream_t backend_stream(Backend& be, const char* section) {
  auto* st = static_cast<cudaStream_t>(be.native_stream());
  NF4FLASH_CHECK(st, section, ": the backend has no CUDA stream");
  return st;
}

// Uploads of one random nf4-dq weight [rows, cols]: enough copies to rotate past the L2.
inline std::vector<std::unique_ptr<Weight>> q4_copies(Context& c, int64_t rows, int64_t cols) {
  const auto host = random_q4(rows, cols, true, c.rng);
  std::vector<std::unique_ptr<Weight>> ws(size_t(c.copies_for(double(rows * cols) / 2)));
  for (auto& w : ws) w = c.be.upload_quant4(host);
  return ws;
}

// The tile16x64 device layout of a 4-bit weight uploaded to the CUDA backend (`section` names the
// caller in the error where the weight is something else).
inline const cuda::Q4Device& tiled_q4(const Weight& w, const char* section) {
  auto* q = dynamic_cast<const cuda_impl::CudaQ4*>(&w);
  NF4FLASH_CHECK(q && !q->fallback, section, ": expected a tiled 4-bit CUDA weight");
  return q->dev;
}

// "a; b; c" ("" when none differed).
inline std::string differ_list(const std::vector<std::string>& differ) {
  std::string list;
  for (const auto& d : differ) list += (list.empty() ? "" : "; ") + d;
  return list;
}

}  // namespace nf4flash::kbench
