// Internal AVX2 helpers for 4-bit codes (used by quant/blockwise.cpp and backend/cpu/matmul_q4.cpp).
// Packed layout: byte k holds element 2k in its high nibble and element 2k+1 in its low nibble.
//   nibbles8(p): the 8 codes of bytes p[0..3] as int32 lanes, in element order.
//   Lut16: a 16-entry float table in two registers; lookup() picks entries by code (permute the
//     low 3 bits in both halves, blend on bit 3).
//   make_lut(table, scale, bf16): table[k] * scale in float32 (the exact product bitsandbytes
//     forms per element), optionally rounded to the nearest-even bf16 value.
// Everything is guarded by __AVX2__; callers keep a scalar fallback.
#pragma once
#ifdef __AVX2__
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace nf4flash::simd4 {

inline __m256 round_bf16_ps(__m256 v) {
  // Same integer trick as f32_to_bf16 (round to nearest even, then drop the low 16 bits); the
  // values here are finite products, so the NaN case of the scalar version does not arise.
  __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  u = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  u = _mm256_and_si256(u, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  return _mm256_castsi256_ps(u);
}

struct Lut16 {
  __m256 lo, hi;
};

inline Lut16 make_lut(const float* table16, float scale, bool round_bf16) {
  const __m256 s = _mm256_set1_ps(scale);
  Lut16 l{_mm256_mul_ps(_mm256_loadu_ps(table16), s), _mm256_mul_ps(_mm256_loadu_ps(table16 + 8), s)};
  if (round_bf16) {
    l.lo = round_bf16_ps(l.lo);
    l.hi = round_bf16_ps(l.hi);
  }
  return l;
}

inline __m256i nibbles8(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  __m128i b = _mm_cvtsi32_si128(static_cast<int>(w));
  b = _mm_unpacklo_epi8(b, b);  // b0 b0 b1 b1 b2 b2 b3 b3
  __m256i v = _mm256_cvtepu8_epi32(b);
  v = _mm256_srlv_epi32(v, _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0));
  return _mm256_and_si256(v, _mm256_set1_epi32(15));
}

inline __m256 lookup(const Lut16& l, __m256i idx) {
  const __m256 a = _mm256_permutevar8x32_ps(l.lo, idx);
  const __m256 b = _mm256_permutevar8x32_ps(l.hi, idx);
  return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

}  // namespace nf4flash::simd4
#endif  // __AVX2__
