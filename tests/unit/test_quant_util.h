// Helpers shared by the test_quant_*.cpp tests: the bitsandbytes vectors file and copying tensors
// out of a WeightStore into typed vectors (the mmapped data need not be aligned).
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "test_util.h"

namespace nf4flash::testq {

using test::model_dir;
inline std::string vectors_path() { return test::fixture("bnb-4bit-vectors.safetensors"); }

template <typename T>
std::vector<T> tensor_vec(const TensorInfo& t) {
  EXPECT_EQ(t.nbytes % sizeof(T), 0u) << t.name;
  std::vector<T> v(t.nbytes / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), t.data, v.size() * sizeof(T));
  return v;
}

template <typename T>
std::vector<T> tensor_vec(const WeightStore& ws, const std::string& name) {
  return tensor_vec<T>(ws.get(name));
}

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace nf4flash::testq
