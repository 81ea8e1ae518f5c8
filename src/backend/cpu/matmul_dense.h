// Dense CPU matmuls for the reference backend: y[m, n] = sum_k x[m, k] * W[n, k].
//   x: f32 row-major [m, k]; W: f32 or bf16 row-major [n, k] (a PyTorch Linear weight); y: f32 [m, n].
// AVX2/FMA where compiled in, multithreaded over n (output features) with the global pool;
// up to 4 rows of x share each pass over a weight row.
#pragma once
#include <cstdint>

namespace nf4flash {

void cpu_matmul_f32(const float* x, int64_t m, const float* w, int64_t n, int64_t k, float* y);
void cpu_matmul_bf16(const float* x, int64_t m, const uint16_t* w, int64_t n, int64_t k, float* y);

}  // namespace nf4flash
