// Bit-exactness of the 4-bit quantizer against bitsandbytes' own outputs
// (fixtures/bnb-4bit-vectors.safetensors: w_i and {nf4,fp4}_{plain,dq}_i.*), code books, the
// SIMD quantizer vs bnb's decision trees, blocksize handling.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "core/error.h"
#include "quant/blockwise.h"
#include "quant/codebook.h"
#include "test_quant_util.h"

using namespace nf4flash;
using namespace nf4flash::testq;

TEST(QuantCodebook, MatchesVectorsFile) {
  auto ws = WeightStore::open_file(vectors_path());
  for (int i = 0; i < 3; ++i) {
    for (const char* t : {"nf4", "fp4"}) {
      const std::string p = std::string(t) + "_dq_" + std::to_string(i);
      const auto code = tensor_vec<float>(*ws, p + ".code");
      const auto& mine = std::string(t) == "nf4" ? nf4_code() : fp4_code();
      ASSERT_EQ(code.size(), 16u);
      for (int k = 0; k < 16; ++k) EXPECT_EQ(bits(code[k]), bits(mine[k])) << p << " " << k;
      const auto nested = tensor_vec<float>(*ws, p + ".nested_code");
      ASSERT_EQ(nested.size(), 256u);
      for (int k = 0; k < 256; ++k)
        EXPECT_EQ(bits(nested[k]), bits(dynamic_map_signed()[k])) << p << " " << k;
    }
  }
  // The dequant tables equal the code books up to the sign of FP4's zero.
  for (QuantType t : {QuantType::NF4, QuantType::FP4})
    for (int k = 0; k < 16; ++k) EXPECT_EQ(dequant_table4(t)[k], code4(t)[k]);
  EXPECT_TRUE(std::signbit(dequant_table4(QuantType::FP4)[8]));
}

TEST(QuantCodebook, Nf4TreePicksNearestCode) {
  // Away from the midpoints, the tree's answer is the nearest NF4 value.
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const auto& c = nf4_code();
  for (int it = 0; it < 100000; ++it) {
    const float x = u(rng);
    int best = 0;
    for (int k = 1; k < 16; ++k)
      if (std::fabs(c[k] - x) < std::fabs(c[best] - x)) best = k;
    const float d1 = std::fabs(c[best] - x);
    float d2 = 1e9f;
    for (int k = 0; k < 16; ++k)
      if (k != best) d2 = std::min(d2, std::fabs(c[k] - x));
    if (d2 - d1 > 1e-6f) {
      EXPECT_EQ(quantize_nf4(x), best) << x;
    }
  }
}

// The SIMD quantizer (threshold counting) against the scalar trees, on values near every
// threshold, random values, zeros, NaN and infinities. Block absmax is forced to 1 by a 1.0.
TEST(QuantBlockwise, SimdMatchesDecisionTrees) {
  std::vector<float> vals = {0.0f, -0.0f, 1.0f, -1.0f, NAN, -NAN, INFINITY, -INFINITY,
                            1e-39f, -1e-39f, FLT_MIN, -FLT_MIN};
  const float thr[] = {-0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f,
                       -0.33967943489551544f, -0.23460740596055984f, -0.13791173323988914f,
                       -0.045525018125772476f, 0.03979014977812767f, 0.1202552504837513f,
                       0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,
                       0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f,
                       0.00260417f, 0.0859375f, 0.20833333f, 0.29166667f, 0.4166667f, 0.583333f,
                       0.8333333f};
  for (float t : thr)
    for (float s : {1.0f, -1.0f}) {
      float v = s * t;
      for (int k = 0; k < 3; ++k) v = std::nextafter(v, -2.0f);
      for (int k = 0; k < 7; ++k, v = std::nextafter(v, 2.0f)) vals.push_back(v);
    }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int i = 0; i < 4000; ++i) vals.push_back(u(rng));
  // Blocks of 64: element 0 is 1.0 (absmax 1), the rest test values (|v| <= 1 or non-finite ones
  // in their own block, where they change absmax; compare against the tree with that absmax).
  const int bs = 64;
  std::vector<float> data;
  for (size_t i = 0; i < vals.size(); ++i) {
    if (data.size() % bs == 0) data.push_back(1.0f);
    data.push_back(vals[i]);
  }
  while (data.size() % bs) data.push_back(0.5f);
  for (QuantType t : {QuantType::NF4, QuantType::FP4}) {
    std::vector<uint8_t> packed(data.size() / 2);
    std::vector<float> absmax(data.size() / bs);
    quantize_blockwise_4bit(data.data(), DType::F32, static_cast<int64_t>(data.size()), t, bs,
                            packed.data(), absmax.data());
    for (size_t b = 0; b < absmax.size(); ++b) {
      float amax = -FLT_MAX;
      for (int k = 0; k < bs; ++k) amax = std::fmax(amax, std::fabs(data[b * bs + k]));
      ASSERT_EQ(bits(absmax[b]), bits(amax)) << b;
      const float inv = bnb_reciprocal(amax);
      for (int k = 0; k < bs; ++k) {
        const size_t i = b * bs + k;
        const uint8_t got = (i & 1) ? (packed[i / 2] & 15) : (packed[i / 2] >> 4);
        ASSERT_EQ(got, quantize4(t, bnb_mul_ftz(data[i], inv)))
            << quant_type_name(t) << " x=" << data[i] << " inv=" << inv;
      }
    }
  }
}

namespace {

void check_vectors(const std::string& type_name, bool dq, int i) {
  auto ws = WeightStore::open_file(vectors_path());
  const std::string p = type_name + (dq ? "_dq_" : "_plain_") + std::to_string(i);
  SCOPED_TRACE(p);
  const TensorInfo& w = ws->get("w_" + std::to_string(i));
  ASSERT_EQ(w.dtype, DType::BF16);
  const auto wdata = tensor_vec<uint16_t>(w);
  QuantType t;
  ASSERT_TRUE(quant_type_from_name(type_name, &t));
  const Quant4Tensor q = quantize_4bit(wdata.data(), DType::BF16, w.shape[0], w.shape[1], t, 64, dq);

  const auto packed = tensor_vec<uint8_t>(*ws, p + ".packed");
  ASSERT_EQ(packed.size(), q.packed.size());
  size_t bad = 0;
  for (size_t k = 0; k < packed.size(); ++k) bad += packed[k] != q.packed[k];
  EXPECT_EQ(bad, 0u) << "packed bytes differing";

  if (!dq) {
    const auto absmax = tensor_vec<float>(*ws, p + ".absmax");
    ASSERT_EQ(absmax.size(), q.absmax.size());
    for (size_t k = 0; k < absmax.size(); ++k) ASSERT_EQ(bits(absmax[k]), bits(q.absmax[k])) << k;
  } else {
    const auto absmax_q = tensor_vec<uint8_t>(*ws, p + ".absmax");
    ASSERT_EQ(absmax_q.size(), q.absmax_q.size());
    for (size_t k = 0; k < absmax_q.size(); ++k) ASSERT_EQ(absmax_q[k], q.absmax_q[k]) << k;
    const auto nested = tensor_vec<float>(*ws, p + ".nested_absmax");
    ASSERT_EQ(nested.size(), q.nested_absmax.size());
    for (size_t k = 0; k < nested.size(); ++k)
      ASSERT_EQ(bits(nested[k]), bits(q.nested_absmax[k])) << k;
    const auto offset = tensor_vec<float>(*ws, p + ".offset");
    ASSERT_EQ(offset.size(), 1u);
    EXPECT_EQ(bits(offset[0]), bits(q.offset));
  }
  const auto code = tensor_vec<float>(*ws, p + ".code");
  for (int k = 0; k < 16; ++k) EXPECT_EQ(bits(code[k]), bits(q.code[k]));

  const auto deq = tensor_vec<uint16_t>(*ws, p + ".dequant_bf16");
  std::vector<uint16_t> mine(q.numel());
  dequantize_4bit_bf16(q, mine.data());
  ASSERT_EQ(deq.size(), mine.size());
  bad = 0;
  for (size_t k = 0; k < deq.size(); ++k) bad += deq[k] != mine[k];
  EXPECT_EQ(bad, 0u) << "dequant_bf16 values differing";
  // f32 dequantization rounds to the same bf16 values.
  std::vector<float> f(q.numel());
  dequantize_4bit(q, f.data());
  for (size_t k = 0; k < f.size(); ++k) ASSERT_EQ(f32_to_bf16(f[k]), deq[k]) << k;
}

}  // namespace

TEST(QuantBlockwise, VectorsNf4Plain) { for (int i = 0; i < 3; ++i) check_vectors("nf4", false, i); }
TEST(QuantBlockwise, VectorsNf4DoubleQuant) { for (int i = 0; i < 3; ++i) check_vectors("nf4", true, i); }
TEST(QuantBlockwise, VectorsFp4Plain) { for (int i = 0; i < 3; ++i) check_vectors("fp4", false, i); }
TEST(QuantBlockwise, VectorsFp4DoubleQuant) { for (int i = 0; i < 3; ++i) check_vectors("fp4", true, i); }

TEST(QuantBlockwise, ZeroOutlierAndPartialBlocks) {
  // All-zero block: bnb computes 0 * (1/0) = NaN and lands on code 0 (NF4 -1.0, FP4 +0) with
  // absmax 0, so it dequantizes to (signed) zero. A partial last block and odd element count.
  std::vector<float> x(64 * 3 + 37, 0.0f);
  for (size_t i = 64; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  x[100] = -7.5f;  // outlier
  for (QuantType t : {QuantType::NF4, QuantType::FP4}) {
    const Quant4Tensor q = quantize_4bit(x.data(), DType::F32, 1, static_cast<int64_t>(x.size()), t, 64, false);
    EXPECT_EQ(q.absmax[0], 0.0f);
    EXPECT_EQ(q.absmax[1], 7.5f);
    for (int k = 0; k < 32; ++k) EXPECT_EQ(q.packed[k], 0u);
    EXPECT_EQ(q.packed.size(), (x.size() + 1) / 2);
    std::vector<float> d(x.size());
    dequantize_4bit(q, d.data());
    for (int k = 0; k < 64; ++k) EXPECT_EQ(d[k], 0.0f);
    EXPECT_EQ(d[100], -7.5f);
    // the pad nibble of the odd tail is the code of zero
    const uint8_t zero_code = t == QuantType::NF4 ? 7 : 0;
    EXPECT_EQ(q.packed.back() & 15, zero_code);
    for (size_t k = 64; k < x.size(); ++k) EXPECT_NEAR(d[k], x[k], 0.3f * q.absmax[k / 64]) << k;
  }
}

TEST(QuantBlockwise, BlocksizesAndDtypes) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> f(48 * 100);
  for (float& v : f) v = nd(rng);
  std::vector<uint16_t> bf(f.size()), h(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    bf[i] = f32_to_bf16(f[i]);
    h[i] = f32_to_f16(bf16_to_f32(bf[i]));  // exactly representable in f16 too
  }
  for (int bs : {32, 64, 128, 256, 512, 1024, 2048, 4096}) {
    for (bool dq : {false, true}) {
      const Quant4Tensor a = quantize_4bit(bf.data(), DType::BF16, 48, 100, QuantType::NF4, bs, dq);
      const Quant4Tensor b = quantize_4bit(h.data(), DType::F16, 48, 100, QuantType::NF4, bs, dq);
      EXPECT_EQ(a.packed, b.packed) << bs;
      EXPECT_EQ(a.num_blocks(), (4800 + bs - 1) / bs);
      EXPECT_NO_THROW(validate_quant4(a, "a"));
      std::vector<float> d(4800);
      dequantize_4bit(a, d.data());
      const std::vector<float> am = expand_absmax(a);
      for (size_t i = 0; i < d.size(); ++i)
        ASSERT_LE(std::fabs(d[i] - bf16_to_f32(bf[i])), 0.2f * am[i / bs] + 0.02f * std::fabs(am[i / bs])) << bs;
    }
  }
  for (int bs : {0, 16, 48, 100, 8192, -64}) {
    EXPECT_THROW(quantize_4bit(bf.data(), DType::BF16, 48, 100, QuantType::NF4, bs, false), Error) << bs;
  }
  EXPECT_THROW(quantize_4bit(bf.data(), DType::I32, 48, 100, QuantType::NF4, 64, false), Error);
  EXPECT_THROW(quantize_4bit(bf.data(), DType::BF16, 48, 100, QuantType::None, 64, false), Error);
}

TEST(QuantBlockwise, QuantTypeNames) {
  QuantType t;
  EXPECT_TRUE(quant_type_from_name("nf4", &t));
  EXPECT_EQ(t, QuantType::NF4);
  EXPECT_TRUE(quant_type_from_name("fp4", &t));
  EXPECT_EQ(t, QuantType::FP4);
  EXPECT_TRUE(quant_type_from_name("none", &t));
  EXPECT_EQ(t, QuantType::None);
  EXPECT_FALSE(quant_type_from_name("int4", &t));
  EXPECT_EQ(quant_type_name(QuantType::FP4), "fp4");
}

TEST(QuantBlockwise, BlockAbsmaxMatchesExpansion) {
  std::vector<float> x(64 * 600);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(0.011f * static_cast<float>(i * i % 977));
  Quant4Tensor q = quantize_4bit(x.data(), DType::F32, 600, 64, QuantType::NF4, 64, true);
  const std::vector<float> am = expand_absmax(q);
  for (int64_t b = 0; b < q.num_blocks(); ++b) ASSERT_EQ(bits(q.block_absmax(b)), bits(am[b]));
  quant4_prepare(q);
  EXPECT_EQ(q.absmax_f32, am);
}
