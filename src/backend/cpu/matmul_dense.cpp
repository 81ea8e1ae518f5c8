#include "backend/cpu/matmul_dense.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"
#include "core/thread_pool.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define NF4FLASH_AVX2 1
#endif

namespace nf4flash {
namespace {

#ifdef NF4FLASH_AVX2
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
#endif

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }

// R rows of x (consecutive, stride k) against one weight row.
template <int R, typename W>
inline void dot_rows(const float* x, int64_t k, const W* w, float* out) {
  int64_t i = 0;
  float acc_s[R] = {};
#ifdef NF4FLASH_AVX2
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (; i + 8 <= k; i += 8) {
    const __m256 wv = load8(w + i);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * k + i), wv, acc[r]);
  }
  for (int r = 0; r < R; ++r) acc_s[r] = hsum(acc[r]);
#endif
  for (; i < k; ++i) {
    const float wv = to_f32(w[i]);
    for (int r = 0; r < R; ++r) acc_s[r] += x[r * k + i] * wv;
  }
  for (int r = 0; r < R; ++r) out[r] = acc_s[r];
}

template <typename W>
void matmul_impl(const float* x, int64_t m, const W* w, int64_t n, int64_t k, float* y) {
  thread_pool().parallel_for(n, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, k)), [&](int64_t n0, int64_t n1) {
    float tmp[4];
    for (int64_t j = n0; j < n1; ++j) {
      const W* wr = w + j * k;
      int64_t r = 0;
      for (; r + 4 <= m; r += 4) {
        dot_rows<4>(x + r * k, k, wr, tmp);
        for (int q = 0; q < 4; ++q) y[(r + q) * n + j] = tmp[q];
      }
      for (; r < m; ++r) {
        dot_rows<1>(x + r * k, k, wr, tmp);
        y[r * n + j] = tmp[0];
      }
    }
  });
}

}  // namespace

void cpu_matmul_f32(const float* x, int64_t m, const float* w, int64_t n, int64_t k, float* y) {
  matmul_impl(x, m, w, n, k, y);
}

void cpu_matmul_bf16(const float* x, int64_t m, const uint16_t* w, int64_t n, int64_t k, float* y) {
  matmul_impl(x, m, w, n, k, y);
}

}  // namespace nf4flash
