// CPU 4-bit matmul over bf16 dot products (see matmul_q4_bf16.h for the layouts and arithmetic).
// Kernel (AVX-512 BF16): threads split the 16-row panels; per panel, x rows in tiles of up to 8;
//   per 32-byte code block, the bytes are widened to 16 bits, split into their two nibble planes
//   and looked up in the bf16 code book (vpermw), and each plane is multiplied with the broadcast
//   activation pair of every row of the tile (vdpbf16ps into a per-chunk f32 sum, which is then
//   scaled by the chunk's absmax).
#include "backend/cpu/matmul_q4_bf16.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/blockwise.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
// GCC 12's AVX-512 headers pass _mm512_undefined_*() as a merge source, which -Wuninitialized
// reports at every inlined use (false positives).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define NF4FLASH_Q4_BF16 1
#endif

namespace nf4flash {

namespace {

constexpr int kP = Q4Panels::kPanelRows;
constexpr int kTileRows = 8;

std::vector<uint16_t> to_bf16_rows(const float* x, int64_t m, int64_t cols) {
  std::vector<uint16_t> xb(static_cast<size_t>(m * cols));
  auto rows = [&](int64_t j0, int64_t j1) {
    for (int64_t i = j0 * cols; i < j1 * cols; ++i) xb[i] = f32_to_bf16(x[i]);
  };
  if (m > 1) thread_pool().parallel_for(m, 1, rows);
  else rows(0, m);
  return xb;
}

#ifdef NF4FLASH_Q4_BF16
inline int32_t load_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Output rows [16p, 16p + 16) for x rows [j0, j0 + MT).
template <int MT>
void panel_tile(const Q4Panels& w, int64_t p, const uint16_t* xb, int64_t j0, float* y) {
  const int64_t cols = w.cols, nch = w.chunks();
  const int C = w.chunk, kb = C / 4;
  alignas(64) uint16_t tbl_words[32] = {};
  std::memcpy(tbl_words, w.table, sizeof(w.table));
  const __m512i tbl = _mm512_load_si512(tbl_words);
  const __m512i low4 = _mm512_set1_epi16(0x0F);
  const uint8_t* cp = w.codes.data() + p * nch * C * 8;
  const uint16_t* sp = w.scales.data() + p * nch * kP;
  __m512 acc[MT];
  for (int j = 0; j < MT; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < nch; ++c) {
    __m512 t[MT];
    for (int j = 0; j < MT; ++j) t[j] = _mm512_setzero_ps();
    const uint16_t* xc = xb + j0 * cols + c * C;
    for (int k = 0; k < kb; ++k) {
      const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(cp + 32 * k)));
      const __m512bh wa = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(b, low4), tbl);
      const __m512bh wb = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), tbl);
      for (int j = 0; j < MT; ++j) {
        const uint16_t* xj = xc + j * cols;
        t[j] = _mm512_dpbf16_ps(t[j], wa, (__m512bh)_mm512_set1_epi32(load_pair(xj + 2 * k)));
        t[j] = _mm512_dpbf16_ps(t[j], wb, (__m512bh)_mm512_set1_epi32(load_pair(xj + 2 * (k + kb))));
      }
    }
    cp += C * 8;
    const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp)));
    sp += kP;
    for (int j = 0; j < MT; ++j) acc[j] = _mm512_fmadd_ps(t[j], ws, acc[j]);
  }
  const int64_t r0 = p * kP;
  const __mmask16 keep = static_cast<__mmask16>(w.rows - r0 >= kP ? 0xFFFF : (1u << (w.rows - r0)) - 1);
  const __m512 out = _mm512_set1_ps(w.out_scale);
  for (int j = 0; j < MT; ++j)
    _mm512_mask_storeu_ps(y + (j0 + j) * w.rows + r0, keep, _mm512_mul_ps(acc[j], out));
}

void panel_rows(const Q4Panels& w, int64_t p, const uint16_t* xb, int64_t m, float* y) {
  int64_t j = 0;
  for (; j + kTileRows <= m; j += kTileRows) panel_tile<kTileRows>(w, p, xb, j, y);
  switch (m - j) {
    case 0: break;
    case 1: panel_tile<1>(w, p, xb, j, y); break;
    case 2: panel_tile<2>(w, p, xb, j, y); break;
    case 3: panel_tile<3>(w, p, xb, j, y); break;
    case 4: panel_tile<4>(w, p, xb, j, y); break;
    case 5: panel_tile<5>(w, p, xb, j, y); break;
    case 6: panel_tile<6>(w, p, xb, j, y); break;
    default: panel_tile<7>(w, p, xb, j, y); break;
  }
}
#endif

}  // namespace

bool q4_bf16_available() {
#ifdef NF4FLASH_Q4_BF16
  return true;
#else
  return false;
#endif
}

bool q4_bf16_supported(const Quant4Tensor& w) {
  const int chunk = std::min(64, w.blocksize);
  return q4_bf16_available() && w.cols > 0 && w.rows > 0 && w.cols % chunk == 0;
}

Q4Panels pack_q4_panels(const Quant4Tensor& w) {
  validate_quant4(w, "pack_q4_panels weight");
  Q4Panels o;
  o.rows = w.rows;
  o.cols = w.cols;
  o.chunk = std::min(64, w.blocksize);
  NF4FLASH_CHECK(w.cols % o.chunk == 0, "pack_q4_panels: cols ", w.cols, " not a multiple of ", o.chunk);
  o.panels = (w.rows + kP - 1) / kP;
  const int64_t nch = o.chunks();
  const int C = o.chunk, kb = C / 4;
  for (int i = 0; i < 16; ++i) o.table[i] = f32_to_bf16(w.code[i]);

  // absmax per (row, chunk), then the power of two that puts the largest in [2^14, 2^15)
  std::vector<float> amax(static_cast<size_t>(w.rows * nch));
  thread_pool().parallel_for(w.rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < nch; ++c) amax[r * nch + c] = std::fabs(w.block_absmax((r * w.cols + c * C) / w.blocksize));
  });
  const float big = amax.empty() ? 0.0f : *std::max_element(amax.begin(), amax.end());
  const int s = big > 0.0f ? 14 - static_cast<int>(std::floor(std::log2(big))) : 0;
  const float up = std::ldexp(1.0f, s);
  o.out_scale = std::ldexp(1.0f, -s);

  o.codes.assign(static_cast<size_t>(o.panels * nch * C * 8), 0);
  o.scales.assign(static_cast<size_t>(o.panels * nch * kP), 0);
  thread_pool().parallel_for(o.panels, 1, [&](int64_t p0, int64_t p1) {
    uint8_t code[64];
    for (int64_t p = p0; p < p1; ++p) {
      for (int r = 0; r < kP; ++r) {
        const int64_t row = p * kP + r;
        if (row >= w.rows) break;  // padded rows: codes 0 with scale 0
        // a row starts on a byte (cols is a multiple of the even chunk): element 2i is the high
        // nibble of byte i, as bitsandbytes packs them
        const uint8_t* src = w.packed.data() + row * w.cols / 2;
        for (int64_t c = 0; c < nch; ++c) {
          for (int i = 0; i < C / 2; ++i) {
            const uint8_t b = src[c * C / 2 + i];
            code[2 * i] = b >> 4;
            code[2 * i + 1] = b & 0x0F;
          }
          uint8_t* dst = &o.codes[static_cast<size_t>((p * nch + c) * C * 8)];
          o.scales[static_cast<size_t>((p * nch + c) * kP + r)] = f32_to_f16(amax[row * nch + c] * up);
          for (int k = 0; k < kb; ++k)
            for (int e = 0; e < 2; ++e)
              dst[k * 32 + 2 * r + e] = static_cast<uint8_t>(code[2 * k + e] | (code[2 * (k + kb) + e] << 4));
        }
      }
    }
  });
  return o;
}

void q4_bf16_matmul(const float* x, int64_t m, const Q4Panels& w, float* y) {
#ifdef NF4FLASH_Q4_BF16
  if (m <= 0) return;
  const std::vector<uint16_t> xb = to_bf16_rows(x, m, w.cols);
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, w.cols * m / 16));
  thread_pool().parallel_for(w.panels, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) panel_rows(w, p, xb.data(), m, y);
  });
#else
  (void)x, (void)m, (void)w, (void)y;
  fail("q4_bf16_matmul: this build has no AVX-512 BF16 kernel");
#endif
}

void q4_bf16_matmul_group(const Q4Product* products, int n) {
#ifdef NF4FLASH_Q4_BF16
  std::vector<std::vector<uint16_t>> xb(static_cast<size_t>(n));
  std::vector<int64_t> start(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    const Q4Product& p = products[i];
    if (p.m > 0) xb[size_t(i)] = to_bf16_rows(p.x, p.m, p.w->cols);
    start[size_t(i) + 1] = start[size_t(i)] + (p.m > 0 ? p.w->panels : 0);
  }
  thread_pool().parallel_for(start[size_t(n)], 1, [&](int64_t p0, int64_t p1) {
    for (int64_t q = p0; q < p1; ++q) {
      const int i = int(std::upper_bound(start.begin(), start.end(), q) - start.begin()) - 1;
      const Q4Product& p = products[i];
      panel_rows(*p.w, q - start[size_t(i)], xb[size_t(i)].data(), p.m, p.y);
    }
  });
#else
  (void)products, (void)n;
  fail("q4_bf16_matmul_group: this build has no AVX-512 BF16 kernel");
#endif
}

void q4_bf16_matmul_reference(const float* x, int64_t m, const Q4Panels& w, float* y) {
  const std::vector<uint16_t> xb = to_bf16_rows(x, m, w.cols);
  const int64_t nch = w.chunks();
  const int C = w.chunk, kb = C / 4;
  auto f = [](uint16_t h) { return bf16_to_f32(h); };
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t row = 0; row < w.rows; ++row) {
      const int64_t p = row / kP;
      const int r = static_cast<int>(row % kP);
      float acc = 0.0f;
      for (int64_t c = 0; c < nch; ++c) {
        const uint8_t* codes = &w.codes[static_cast<size_t>((p * nch + c) * C * 8)];
        const uint16_t* xc = &xb[static_cast<size_t>(j * w.cols + c * C)];
        float t = 0.0f;
        for (int k = 0; k < kb; ++k) {
          const uint8_t b0 = codes[k * 32 + 2 * r], b1 = codes[k * 32 + 2 * r + 1];
          // vdpbf16ps: the odd element of a pair first, then the even one
          t = std::fma(f(w.table[b1 & 0x0F]), f(xc[2 * k + 1]), t);
          t = std::fma(f(w.table[b0 & 0x0F]), f(xc[2 * k]), t);
          t = std::fma(f(w.table[b1 >> 4]), f(xc[2 * (k + kb) + 1]), t);
          t = std::fma(f(w.table[b0 >> 4]), f(xc[2 * (k + kb)]), t);
        }
        acc = std::fma(t, f16_to_f32(w.scales[static_cast<size_t>((p * nch + c) * kP + r)]), acc);
      }
      y[j * w.rows + row] = acc * w.out_scale;
    }
  }
}

}  // namespace nf4flash
