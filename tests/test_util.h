// Shared helpers for the test suite: fixture paths, golden tensors, distances.
#pragma once
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda_tuning.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace nf4flash::test {

inline std::string fixture(const std::string& rel) { return std::string(NF4FLASH_FIXTURES_DIR) + "/" + rel; }
inline std::string model_dir(const std::string& name) { return fixture("models/" + name); }

// A golden file: NAME.golden.safetensors with f32/i32 tensors.
class Golden {
 public:
  explicit Golden(const std::string& model) : st_(fixture("models/" + model + ".golden.safetensors")) {}
  std::vector<float> f32(const std::string& name) const {
    const TensorInfo& t = get(name);
    std::vector<float> v(t.numel());
    std::memcpy(v.data(), t.data, t.nbytes);
    return v;
  }
  std::vector<int32_t> i32(const std::string& name) const {
    const TensorInfo& t = get(name);
    std::vector<int32_t> v(t.numel());
    std::memcpy(v.data(), t.data, t.nbytes);
    return v;
  }
  std::vector<int64_t> shape(const std::string& name) const { return get(name).shape; }

 private:
  const TensorInfo& get(const std::string& name) const {
    const TensorInfo* t = st_.find(name);
    if (!t) fail("golden tensor ", name, " missing");
    return *t;
  }
  SafetensorsFile st_;
};

// ||a - b|| / ||b||
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(num / std::max(den, 1e-30));
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

inline std::vector<float> flatten(const std::vector<std::vector<float>>& rows, size_t first = 0) {
  std::vector<float> out;
  for (size_t i = first; i < rows.size(); ++i) out.insert(out.end(), rows[i].begin(), rows[i].end());
  return out;
}

// ---- scoped backend tuning (tests set the tuning struct, not the environment) ----
// The default CudaTuning with `edit` applied: for CudaBackendOptions::tuning, or for
// ScopedCudaTuning (backend/cuda_tuning.h) where the engine creates the backend.
inline CudaTuning tuning_with(const std::function<void(CudaTuning&)>& edit) {
  CudaTuning t;
  edit(t);
  return t;
}

}  // namespace nf4flash::test
