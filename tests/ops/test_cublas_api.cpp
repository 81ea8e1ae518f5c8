// cuBLAS is loaded on first use (backend/cuda/cublas_api.h), not linked: the loader finds the
// library and every function the backend calls, and the status names come from it. No GPU needed
// (dlopen and pure functions only), so this runs wherever the CUDA build runs.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/cublas_api.h"

namespace nf4flash::test {
namespace {

TEST(CublasApi, LoadsOnFirstUseWithEveryFunction) {
  const cuda::CublasApi& a = cuda::cublas();
  EXPECT_NE(a.create, nullptr);
  EXPECT_NE(a.destroy, nullptr);
  EXPECT_NE(a.set_stream, nullptr);
  EXPECT_NE(a.set_workspace, nullptr);
  EXPECT_NE(a.set_math_mode, nullptr);
  EXPECT_NE(a.gemm_ex, nullptr);
  EXPECT_NE(a.gemm_strided_batched_ex, nullptr);
  EXPECT_EQ(std::string(a.status_name(CUBLAS_STATUS_NOT_INITIALIZED)), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_FALSE(std::string(a.status_string(CUBLAS_STATUS_INVALID_VALUE)).empty());
  EXPECT_EQ(&cuda::cublas(), &a);  // loaded once
}

}  // namespace
}  // namespace nf4flash::test
