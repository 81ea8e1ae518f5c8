// CPU fused dequantizing 4-bit matmul (see matmul_q4.h for the contract).
// m <= 4 (decode): each weight row is decoded in registers (per block a 16-entry LUT of
//   code * absmax, then permute lookups) and multiplied straight into m accumulators; for 1 or 2
//   x rows, 4 or 2 weight rows at a time (their FMA chains interleaved; each row's sums unchanged).
// m > 4: x tiles of kTileM rows (serial) → weight row groups of kRowsPerGroup (parallel) →
//   dequantize the group's rows once into a thread-local buffer → 4x3 register-blocked dot
//   products (4 weight rows × 3 x rows, 12 AVX2 accumulators; then 4x2) over cols.
#include "backend/cpu/matmul_q4.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/blockwise.h"
#include "quant/codebook.h"
#include "quant/simd4.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace nf4flash {

namespace {

constexpr int64_t kRowsPerGroup = 4;
constexpr int64_t kTileM = 64;

#ifdef __AVX2__
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

#ifdef __AVX2__
// y[j + i, r0 + r] for i < J, r < 4: dot(x[j + i, :], wbuf[r, :]), J x rows against the group's 4
// weight rows in one pass (4 J accumulators, J + 4 loads per 4 J FMAs).
template <int J>
void dot_rows4(const float* x, int64_t j, int64_t cols, const float* wbuf, float* y, int64_t ldy, int64_t r0) {
  const float* xa = x + j * cols;
  __m256 acc[J][4];
  for (int i = 0; i < J; ++i)
    for (int r = 0; r < 4; ++r) acc[i][r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= cols; k += 8) {
    __m256 xv[J];
    for (int i = 0; i < J; ++i) xv[i] = _mm256_loadu_ps(xa + i * cols + k);
    for (int r = 0; r < 4; ++r) {
      const __m256 w = _mm256_loadu_ps(wbuf + r * cols + k);
      for (int i = 0; i < J; ++i) acc[i][r] = _mm256_fmadd_ps(xv[i], w, acc[i][r]);
    }
  }
  float s[J][4];
  for (int i = 0; i < J; ++i)
    for (int r = 0; r < 4; ++r) s[i][r] = hsum(acc[i][r]);
  for (; k < cols; ++k)
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < J; ++i) s[i][r] += xa[i * cols + k] * wbuf[r * cols + k];
  for (int i = 0; i < J; ++i)
    for (int r = 0; r < 4; ++r) y[(j + i) * ldy + r0 + r] = s[i][r];
}
#endif

// y[j, r] for j in [j0, j1), r in [r0, r0 + nr): dot(x[j, :], wbuf[r - r0, :]).
void dot_group(const float* x, int64_t j0, int64_t j1, int64_t cols, const float* wbuf,
               int64_t nr, float* y, int64_t ldy, int64_t r0) {
  int64_t j = j0;
#ifdef __AVX2__
  if (nr == kRowsPerGroup) {
    // three x rows at a time, then a pair
    for (; j + 3 <= j1; j += 3) dot_rows4<3>(x, j, cols, wbuf, y, ldy, r0);
    for (; j + 2 <= j1; j += 2) dot_rows4<2>(x, j, cols, wbuf, y, ldy, r0);
  }
#endif
  for (; j < j1; ++j) {
    const float* xa = x + j * cols;
    for (int64_t r = 0; r < nr; ++r) {
      const float* w = wbuf + r * cols;
      int64_t k = 0;
      float s = 0.0f;
#ifdef __AVX2__
      __m256 acc = _mm256_setzero_ps();
      for (; k + 8 <= cols; k += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(xa + k), _mm256_loadu_ps(w + k), acc);
      s = hsum(acc);
#endif
      for (; k < cols; ++k) s += xa[k] * w[k];
      y[j * ldy + r0 + r] = s;
    }
  }
}

// y[j, r] for r in [r0, r1), j < M: weights decoded in registers, never stored.
template <int M>
void fused_rows(const Quant4Tensor& w, const float* absmax, bool bf16, const float* x, int64_t r0,
                int64_t r1, float* y) {
  const float* table = dequant_table4(w.type).data();
  const int64_t cols = w.cols, rows = w.rows, bs = w.blocksize;
  const uint8_t* packed = w.packed.data();
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t row0 = r * cols;
    int64_t i = row0;
    const int64_t end = row0 + cols;
    float tail[M] = {};
#ifdef __AVX2__
    __m256 acc[M];
    for (int j = 0; j < M; ++j) acc[j] = _mm256_setzero_ps();
#endif
    while (i < end) {
      const int64_t b = i / bs;
      const int64_t seg_end = std::min(end, (b + 1) * bs);
      const float scale = absmax ? absmax[b] : w.block_absmax(b);
      auto scalar_one = [&](int64_t e) {
        const uint8_t byte = packed[e >> 1];
        float v = table[(e & 1) ? (byte & 0x0F) : (byte >> 4)] * scale;
        if (bf16) v = round_bf16(v);
        for (int j = 0; j < M; ++j) tail[j] += x[j * cols + (e - row0)] * v;
      };
      if (i & 1) scalar_one(i++);
#ifdef __AVX2__
      const simd4::Lut16 lut = simd4::make_lut(table, scale, bf16);
      for (; i + 8 <= seg_end; i += 8) {
        const __m256 wv = simd4::lookup(lut, simd4::nibbles8(packed + (i >> 1)));
        const int64_t k = i - row0;
        for (int j = 0; j < M; ++j)
          acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + j * cols + k), wv, acc[j]);
      }
#endif
      for (; i < seg_end; ++i) scalar_one(i);
    }
    for (int j = 0; j < M; ++j) {
      float s = tail[j];
#ifdef __AVX2__
      s += hsum(acc[j]);
#endif
      y[j * rows + r] = s;
    }
  }
}

#ifdef __AVX2__
// fused_rows for rows whose blocks all start at a multiple of 8 columns into the row (cols and
// the blocksize multiples of 8, every block inside one row): RB rows at a time, so that their FMA
// chains interleave (one row's chain waits on the FMA latency every 8 weights). Each row's
// arithmetic is fused_rows' exactly: the same lookups, and acc[j] += x * w over k in order.
template <int M, int RB>
void fused_rows_aligned(const Quant4Tensor& w, const float* absmax, bool bf16, const float* x, int64_t r0,
                        int64_t r1, float* y) {
  const float* table = dequant_table4(w.type).data();
  const int64_t cols = w.cols, rows = w.rows, bs = w.blocksize;
  const uint8_t* packed = w.packed.data();
  int64_t r = r0;
  for (; r + RB <= r1; r += RB) {
    __m256 acc[RB][M];
    for (int q = 0; q < RB; ++q)
      for (int j = 0; j < M; ++j) acc[q][j] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < cols; c0 += bs) {
      simd4::Lut16 lut[RB];
      for (int q = 0; q < RB; ++q) {
        const int64_t b = ((r + q) * cols + c0) / bs;
        lut[q] = simd4::make_lut(table, absmax ? absmax[b] : w.block_absmax(b), bf16);
      }
      for (int64_t k = c0; k < c0 + bs; k += 8) {
        __m256 xv[M];
        for (int j = 0; j < M; ++j) xv[j] = _mm256_loadu_ps(x + j * cols + k);
        for (int q = 0; q < RB; ++q) {
          const __m256 wv = simd4::lookup(lut[q], simd4::nibbles8(packed + (((r + q) * cols + k) >> 1)));
          for (int j = 0; j < M; ++j) acc[q][j] = _mm256_fmadd_ps(xv[j], wv, acc[q][j]);
        }
      }
    }
    for (int q = 0; q < RB; ++q)
      for (int j = 0; j < M; ++j) y[j * rows + r + q] = 0.0f + hsum(acc[q][j]);
  }
  if (r < r1) fused_rows<M>(w, absmax, bf16, x, r, r1, y);
}
#endif

// fused_rows, or for 1 and 2 x rows its interleaved form where the blocks allow (with 3 or 4 x
// rows one weight row already carries 3 or 4 FMA chains).
template <int M>
void decode_rows(const Quant4Tensor& w, const float* absmax, bool bf16, const float* x, int64_t r0, int64_t r1,
                 float* y) {
#ifdef __AVX2__
  if constexpr (M <= 2) {
    if (w.cols % 8 == 0 && w.blocksize % 8 == 0 && w.cols % w.blocksize == 0)
      return fused_rows_aligned<M, M == 1 ? 4 : 2>(w, absmax, bf16, x, r0, r1, y);
  }
#endif
  fused_rows<M>(w, absmax, bf16, x, r0, r1, y);
}

}  // namespace

void cpu_matmul_q4(const float* x, int64_t m, const Quant4Tensor& w, float* y,
                   bool round_weights_bf16) {
  validate_quant4(w, "cpu_matmul_q4 weight");
  NF4FLASH_CHECK(m >= 0, "cpu_matmul_q4: negative row count ", m);
  if (m == 0) return;
  // Double quant without the quant4_prepare cache: absmax is expanded per block as it is used
  // (one lookup, multiply and add per block), so no per-call buffer is needed.
  const float* absmax = !w.double_quant ? w.absmax.data()
                        : w.absmax_f32.empty() ? nullptr
                                               : w.absmax_f32.data();
  const int64_t rows = w.rows, cols = w.cols;
  if (m <= 4) {
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1));
    thread_pool().parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
      switch (m) {
        case 1: decode_rows<1>(w, absmax, round_weights_bf16, x, r0, r1, y); break;
        case 2: decode_rows<2>(w, absmax, round_weights_bf16, x, r0, r1, y); break;
        case 3: decode_rows<3>(w, absmax, round_weights_bf16, x, r0, r1, y); break;
        default: decode_rows<4>(w, absmax, round_weights_bf16, x, r0, r1, y); break;
      }
    });
    return;
  }
  const int64_t groups = (rows + kRowsPerGroup - 1) / kRowsPerGroup;
  for (int64_t t0 = 0; t0 < m; t0 += kTileM) {
    const int64_t t1 = std::min(m, t0 + kTileM);
    thread_pool().parallel_for(groups, 1, [&](int64_t g0, int64_t g1) {
      std::vector<float> wbuf(static_cast<size_t>(kRowsPerGroup * cols));
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t r0 = g * kRowsPerGroup;
        const int64_t nr = std::min(kRowsPerGroup, rows - r0);
        dequantize_4bit_range(w, absmax, r0 * cols, nr * cols, round_weights_bf16, wbuf.data());
        dot_group(x, t0, t1, cols, wbuf.data(), nr, y, rows, r0);
      }
    });
  }
}

}  // namespace nf4flash
