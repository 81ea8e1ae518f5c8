// Eager attention on CUDA (transformers' eager: materialized scores), host orchestration of
// cuBLAS strided-batched GEMMs and the softmax kernel (launchers.h "Eager").
#pragma once
#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

// Bound on the score + probability buffer of one call (heads and query rows are chunked to fit).
constexpr size_t kEagerScoreBudget = size_t(512) << 20;

struct EagerPlan {
  int64_t L = 0;          // key length computed over (largest chunk)
  int heads_per_call = 0; // q heads of one kv group per GEMM batch
  int rows_per_chunk = 0;
  size_t s_bytes = 0;     // f32 scores region
  size_t bytes = 0;       // scores + probabilities
};
// pos0_host >= 0: positions known on the host (L = pos0_host + T); -1: L = capacity (capturable).
EagerPlan attention_eager_plan(const AttnArgs& a, int64_t pos0_host);
void attention_eager(const AttnArgs& a, int64_t pos0_host, cublasHandle_t h, bool tf32, void* scratch,
                     size_t scratch_bytes, cudaStream_t st);

}  // namespace nf4flash::cuda
