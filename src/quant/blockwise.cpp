// Blockwise 4-bit (NF4/FP4) quantization with double quant, and dequantization; bit-exact with
// bitsandbytes (see blockwise.h for the arithmetic). Work is split over blocks with thread_pool().
//
// The AVX2 quantizer replaces bnb's decision trees by counting thresholds: the NF4 tree's 15
// thresholds are sorted, so its code equals the number of thresholds t with x > t (a NaN passes
// none: code 0, as in the tree). FP4 counts the 7 magnitude thresholds on |x| and maps the rank
// to the FP4 code ([0,1,6,7,4,5,2,3]), plus 8 when x < 0. The tests check both against the trees.
#include "quant/blockwise.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/codebook.h"
#include "quant/simd4.h"

#ifdef __AVX512F__
// GCC 12's AVX-512 headers pass _mm512_undefined_*() as a merge source, which -Wuninitialized
// reports at every inlined use (false positives).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Float arithmetic below must round exactly as bitsandbytes does: no FMA contraction.
#pragma GCC optimize("fp-contract=off")

namespace nf4flash {

bool valid_blocksize_4bit(int blocksize) {
  return blocksize >= 32 && blocksize <= 4096 && (blocksize & (blocksize - 1)) == 0;
}

void check_blocksize_4bit(int blocksize) {
  if (!valid_blocksize_4bit(blocksize))
    fail("unsupported 4-bit blocksize ", blocksize,
         "; bitsandbytes allows 32, 64, 128, 256, 512, 1024, 2048, 4096");
}

namespace {

constexpr int kMaxBlock = 4096;

// Convert n elements starting at flat index `begin` of `data` (dtype) to float.
void load_f32(const void* data, DType dtype, int64_t begin, int64_t n, float* out) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, static_cast<const float*>(data) + begin, static_cast<size_t>(n) * 4);
      return;
    case DType::BF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + begin;
      int64_t i = 0;
#ifdef __AVX2__
      for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
      }
#endif
      for (; i < n; ++i) out[i] = bf16_to_f32(p[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + begin;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(p[i]);
      return;
    }
    default:
      fail("cannot quantize ", dtype_name(dtype), " data to 4 bits (need BF16, F16 or F32)");
  }
}

float block_absmax_f32(const float* x, int64_t n) {
  // fmaxf(acc, |x|) from -FLT_MAX, as the kernel does (a NaN element is ignored).
  float m = -FLT_MAX;
  int64_t i = 0;
#ifdef __AVX2__
  __m256 acc = _mm256_set1_ps(-FLT_MAX);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (; i + 8 <= n; i += 8) {
    // max_ps returns its second operand when either is NaN: acc survives a NaN element.
    acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), absmask), acc);
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, acc);
  for (float v : t) m = v > m ? v : m;
#endif
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    m = a > m ? a : m;  // = fmaxf(m, a): a NaN a is ignored
  }
  return m;
}

// codes[i] = quantize4(type, x[i] * inv) for i < n (codes as int32 for the SIMD path).
void quantize_codes(QuantType type, const float* x, int64_t n, float inv, uint8_t* codes) {
  int64_t i = 0;
#ifdef __AVX2__
  static const float kNf4T[15] = {-0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f,
                                  -0.33967943489551544f, -0.23460740596055984f,
                                  -0.13791173323988914f, -0.045525018125772476f,
                                  0.03979014977812767f, 0.1202552504837513f, 0.2035212516784668f,
                                  0.2920137718319893f, 0.3893125355243683f, 0.5016634166240692f,
                                  0.6427869200706482f, 0.8614784181118011f};
  static const float kFp4T[7] = {0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f,
                                 0.4166667f,  0.583333f,  0.8333333f};
#ifdef __AVX512F__
  // NF4, 16 at a time: the count of thresholds below y by binary search over the sorted 15
  // (4 steps of permute, compare and masked add; the same count as the AVX2 loop below).
  if (type == QuantType::NF4) {
    alignas(64) float tbl[16];
    std::memcpy(tbl, kNf4T, sizeof kNf4T);
    tbl[15] = INFINITY;  // never indexed: the search reads entries 0..14
    const __m512 T = _mm512_load_ps(tbl);
    const __m512 vinv16 = _mm512_set1_ps(inv);
    const __m512 fltmin16 = _mm512_set1_ps(FLT_MIN);
    for (; i + 16 <= n; i += 16) {
      __m512 xv = _mm512_loadu_ps(x + i);
      xv = _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(_mm512_abs_ps(xv), fltmin16, _CMP_LT_OQ), xv);
      __m512 y = _mm512_mul_ps(xv, vinv16);
      y = _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(_mm512_abs_ps(y), fltmin16, _CMP_LT_OQ), y);
      __m512i idx = _mm512_setzero_si512();
      for (int step : {8, 4, 2, 1}) {
        const __m512 t = _mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(step - 1)), T);
        idx = _mm512_mask_add_epi32(idx, _mm512_cmp_ps_mask(y, t, _CMP_GT_OQ), idx, _mm512_set1_epi32(step));
      }
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(idx));
    }
  }
#endif
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i rank_to_fp4 = _mm256_setr_epi32(0, 1, 6, 7, 4, 5, 2, 3);
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 fltmin = _mm256_set1_ps(FLT_MIN);
  alignas(32) int32_t c[8];
  for (; i + 8 <= n; i += 8) {
    // bnb_mul_ftz: flush subnormal inputs and products to zero (NaN compares false: kept).
    __m256 xv = _mm256_loadu_ps(x + i);
    xv = _mm256_andnot_ps(_mm256_cmp_ps(_mm256_and_ps(xv, absmask), fltmin, _CMP_LT_OQ), xv);
    __m256 y = _mm256_mul_ps(xv, vinv);
    y = _mm256_andnot_ps(_mm256_cmp_ps(_mm256_and_ps(y, absmask), fltmin, _CMP_LT_OQ), y);
    __m256i cnt = _mm256_setzero_si256();
    if (type == QuantType::NF4) {
      for (float t : kNf4T)
        cnt = _mm256_sub_epi32(
            cnt, _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_set1_ps(t), _CMP_GT_OQ)));
    } else {
      const __m256 a = _mm256_and_ps(y, absmask);
      for (float t : kFp4T)
        cnt = _mm256_sub_epi32(
            cnt, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(t), _CMP_GT_OQ)));
      cnt = _mm256_permutevar8x32_epi32(rank_to_fp4, cnt);
      const __m256i neg = _mm256_castps_si256(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_LT_OQ));
      cnt = _mm256_or_si256(cnt, _mm256_and_si256(neg, _mm256_set1_epi32(8)));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(c), cnt);
    for (int k = 0; k < 8; ++k) codes[i + k] = static_cast<uint8_t>(c[k]);
  }
#endif
  for (; i < n; ++i) codes[i] = quantize4(type, bnb_mul_ftz(x[i], inv));
}

}  // namespace

void quantize_blockwise_4bit(const void* data, DType dtype, int64_t n, QuantType type,
                             int blocksize, uint8_t* packed, float* absmax) {
  check_blocksize_4bit(blocksize);
  if (type != QuantType::NF4 && type != QuantType::FP4)
    fail("4-bit quantization needs quant type nf4 or fp4, got ", quant_type_name(type));
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
  const int64_t grain = std::max<int64_t>(1, 16384 / blocksize);
  thread_pool().parallel_for(nblocks, grain, [&](int64_t b0, int64_t b1) {
    alignas(32) float x[kMaxBlock + 8];
    alignas(32) uint8_t codes[kMaxBlock + 8];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * blocksize;
      const int64_t len = std::min<int64_t>(blocksize, n - begin);
      load_f32(data, dtype, begin, len, x);
      const float amax = block_absmax_f32(x, len);
      absmax[b] = amax;
      const float inv = bnb_reciprocal(amax);
      int64_t qlen = len;
      if (len & 1) x[qlen++] = 0.0f;  // odd tail: the kernel quantizes a zero pad (0 * inv)
      quantize_codes(type, x, qlen, inv, codes);
      uint8_t* out = packed + begin / 2;  // blocksize is even, so blocks start on a byte
      int64_t k = 0;
#ifdef __AVX512BW__
      // 64 codes -> 32 bytes: each pair (even, odd) summed as even * 16 + odd, then narrowed
      for (; k + 64 <= qlen; k += 64) {
        const __m512i c = _mm512_loadu_si512(codes + k);
        const __m512i pairs = _mm512_maddubs_epi16(c, _mm512_set1_epi16(0x0110));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k / 2), _mm512_cvtepi16_epi8(pairs));
      }
#endif
      for (; k < qlen; k += 2) out[k / 2] = static_cast<uint8_t>((codes[k] << 4) | codes[k + 1]);
    }
  });
}

void quantize_blockwise_8bit(const float* x, int64_t n, int blocksize,
                             const std::array<float, 256>& code, uint8_t* out, float* absmax) {
  NF4FLASH_CHECK(blocksize > 0, "8-bit blocksize must be positive, got ", blocksize);
  const int64_t nblocks = (n + blocksize - 1) / blocksize;
  thread_pool().parallel_for(nblocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * blocksize;
      const int64_t len = std::min<int64_t>(blocksize, n - begin);
      const float amax = block_absmax_f32(x + begin, len);
      absmax[b] = amax;
      const float inv = bnb_reciprocal(amax);
      for (int64_t k = 0; k < len; ++k)
        out[begin + k] = quantize_dynamic8(code, bnb_mul_ftz(x[begin + k], inv));
    }
  });
}

float absmax_mean(const float* absmax, int64_t n) {
  // torch's CUDA mean is sum * factor with factor = 1.0f / n in float32 (MeanOps), not sum / n:
  // that float multiply is what moves the offset an ulp away from the float64 mean. The sum of
  // these positive values is taken exactly enough in double and rounded once.
  if (n <= 0) return 0.0f;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += absmax[i];
  const float factor = 1.0f / static_cast<float>(n);
  return static_cast<float>(s) * factor;
}

Quant4Tensor quantize_4bit(const void* data, DType dtype, int64_t rows, int64_t cols,
                           const Quant4Options& opt) {
  check_blocksize_4bit(opt.blocksize);
  NF4FLASH_CHECK(rows > 0 && cols > 0, "cannot quantize a weight of shape [", rows, ", ", cols, "]");
  NF4FLASH_CHECK(opt.nested_blocksize > 0, "nested blocksize must be positive");
  Quant4Tensor q;
  q.type = opt.type;
  q.rows = rows;
  q.cols = cols;
  q.blocksize = opt.blocksize;
  q.orig_dtype = dtype;
  q.code = code4(opt.type);
  const int64_t n = rows * cols;
  const int64_t nb = q.num_blocks();
  q.packed.resize(static_cast<size_t>((n + 1) / 2));
  std::vector<float> absmax(static_cast<size_t>(nb));
  quantize_blockwise_4bit(data, dtype, n, opt.type, opt.blocksize, q.packed.data(), absmax.data());
  if (!opt.double_quant) {
    q.absmax = std::move(absmax);
    return q;
  }
  q.double_quant = true;
  q.nested_blocksize = opt.nested_blocksize;
  q.nested_code = dynamic_map_signed();
  q.offset = opt.offset ? *opt.offset : absmax_mean(absmax.data(), nb);
  for (float& a : absmax) a = a - q.offset;
  q.absmax_q.resize(static_cast<size_t>(nb));
  q.nested_absmax.resize(static_cast<size_t>((nb + opt.nested_blocksize - 1) / opt.nested_blocksize));
  quantize_blockwise_8bit(absmax.data(), nb, opt.nested_blocksize, q.nested_code, q.absmax_q.data(),
                          q.nested_absmax.data());
  return q;
}

Quant4Tensor quantize_4bit(const void* data, DType dtype, int64_t rows, int64_t cols,
                           QuantType type, int blocksize, bool double_quant) {
  Quant4Options opt;
  opt.type = type;
  opt.blocksize = blocksize;
  opt.double_quant = double_quant;
  return quantize_4bit(data, dtype, rows, cols, opt);
}

void validate_quant4(const Quant4Tensor& q, const std::string& what) {
  if (q.type != QuantType::NF4 && q.type != QuantType::FP4)
    fail(what, ": quant type must be nf4 or fp4, got ", quant_type_name(q.type));
  if (!valid_blocksize_4bit(q.blocksize))
    fail(what, ": unsupported blocksize ", q.blocksize,
         " (bitsandbytes allows 32, 64, 128, 256, 512, 1024, 2048, 4096)");
  if (q.rows <= 0 || q.cols <= 0) fail(what, ": bad shape [", q.rows, ", ", q.cols, "]");
  const int64_t n = q.numel(), nb = q.num_blocks();
  if (static_cast<int64_t>(q.packed.size()) != (n + 1) / 2)
    fail(what, ": packed weight has ", q.packed.size(), " bytes, shape [", q.rows, ", ", q.cols,
         "] needs ", (n + 1) / 2);
  if (!q.double_quant) {
    if (static_cast<int64_t>(q.absmax.size()) != nb)
      fail(what, ": absmax has ", q.absmax.size(), " values, expected ", nb, " (", n,
           " elements / blocksize ", q.blocksize, ")");
    return;
  }
  if (static_cast<int64_t>(q.absmax_q.size()) != nb)
    fail(what, ": absmax has ", q.absmax_q.size(), " codes, expected ", nb, " (", n,
         " elements / blocksize ", q.blocksize, ")");
  if (q.nested_blocksize <= 0) fail(what, ": bad nested blocksize ", q.nested_blocksize);
  const int64_t nnb = (nb + q.nested_blocksize - 1) / q.nested_blocksize;
  if (static_cast<int64_t>(q.nested_absmax.size()) != nnb)
    fail(what, ": nested_absmax has ", q.nested_absmax.size(), " values, expected ", nnb, " (",
         nb, " blocks / nested blocksize ", q.nested_blocksize, ")");
  if (!q.absmax_f32.empty() && static_cast<int64_t>(q.absmax_f32.size()) != nb)
    fail(what, ": cached absmax has ", q.absmax_f32.size(), " values, expected ", nb);
}

std::vector<float> expand_absmax(const Quant4Tensor& q) {
  if (!q.double_quant) return q.absmax;
  if (!q.absmax_f32.empty()) return q.absmax_f32;
  const int64_t nb = q.num_blocks();
  std::vector<float> out(static_cast<size_t>(nb));
  for (int64_t b = 0; b < nb; ++b) {
    const float p = q.nested_code[q.absmax_q[b]] * q.nested_absmax[b / q.nested_blocksize];
    out[b] = p + q.offset;  // no contraction in this file: the product is rounded first
  }
  return out;
}

void quant4_prepare(Quant4Tensor& q) {
  if (!q.double_quant || !q.absmax_f32.empty()) return;
  q.absmax_f32 = expand_absmax(q);
}

void dequantize_4bit_range(const Quant4Tensor& q, const float* absmax, int64_t begin,
                           int64_t count, bool round_bf16, float* out) {
  const float* table = dequant_table4(q.type).data();
  const int bs = q.blocksize;
  int64_t i = begin;
  const int64_t end = begin + count;
  while (i < end) {
    const int64_t b = i / bs;
    const int64_t seg_end = std::min<int64_t>(end, (b + 1) * bs);
    const float scale = absmax ? absmax[b] : q.block_absmax(b);
    // Scalar head to reach an even (byte-aligned) element.
    if (i & 1) {
      const float v = table[q.packed[i >> 1] & 0x0F] * scale;
      *out++ = round_bf16 ? nf4flash::round_bf16(v) : v;
      ++i;
    }
#ifdef __AVX2__
    const simd4::Lut16 lut = simd4::make_lut(table, scale, round_bf16);
    for (; i + 8 <= seg_end; i += 8, out += 8)
      _mm256_storeu_ps(out, simd4::lookup(lut, simd4::nibbles8(&q.packed[i >> 1])));
#endif
    for (; i < seg_end; ++i) {
      const uint8_t byte = q.packed[i >> 1];
      const float v = table[(i & 1) ? (byte & 0x0F) : (byte >> 4)] * scale;
      *out++ = round_bf16 ? nf4flash::round_bf16(v) : v;
    }
  }
}

void dequantize_4bit(const Quant4Tensor& q, float* out) {
  validate_quant4(q, "dequantize_4bit");
  const std::vector<float> absmax = expand_absmax(q);
  const int64_t n = q.numel();
  const int64_t chunk = 65536;
  thread_pool().parallel_for((n + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    const int64_t b = c0 * chunk, e = std::min(n, c1 * chunk);
    dequantize_4bit_range(q, absmax.data(), b, e - b, false, out + b);
  });
}

void dequantize_4bit_bf16(const Quant4Tensor& q, uint16_t* out) {
  validate_quant4(q, "dequantize_4bit_bf16");
  const std::vector<float> absmax = expand_absmax(q);
  const int64_t n = q.numel();
  const int64_t chunk = 16384;
  thread_pool().parallel_for((n + chunk - 1) / chunk, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> tmp(static_cast<size_t>(chunk));
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = c * chunk, len = std::min(chunk, n - b);
      dequantize_4bit_range(q, absmax.data(), b, len, false, tmp.data());
      for (int64_t k = 0; k < len; ++k) out[b + k] = f32_to_bf16(tmp[k]);
    }
  });
}

}  // namespace nf4flash
