// q4_bf16_matmul (the CPU fast path for 4-bit weights): equal to its scalar reference (to f32
// rounding: vdpbf16ps flushes denormals and its internal rounding is the CPU's), close to the
// exact dequantized product (bf16 activations and code book), and the same for a row whether it
// is multiplied alone or among others (the batched engine relies on that).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/matmul_q4_bf16.h"
#include "quant/blockwise.h"

using namespace nf4flash;

namespace {

struct Case {
  int64_t rows, cols;
  int blocksize;
  QuantType type;
  bool dq;
};

Quant4Tensor make(const Case& c, unsigned seed, std::vector<float>* dequant) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(c.rows * c.cols);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.02f * nd(rng) * (1.0f + static_cast<float>(i % 7));
  Quant4Tensor q = quantize_4bit(w.data(), DType::F32, c.rows, c.cols, c.type, c.blocksize, c.dq);
  dequant->resize(w.size());
  dequantize_4bit(q, dequant->data());
  return q;
}

std::vector<float> random_x(int64_t m, int64_t cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(m * cols);
  for (float& v : x) v = nd(rng);
  return x;
}

const Case kCases[] = {
    {64, 256, 64, QuantType::NF4, true},   {37, 128, 64, QuantType::NF4, false},  // padded panel
    {48, 192, 32, QuantType::FP4, false},  {16, 640, 128, QuantType::NF4, true},  // chunk 32; 128 spans chunks
    {5, 64, 4096, QuantType::NF4, true},                                          // one block spans rows
};

}  // namespace

TEST(QuantMatmulBf16, KernelMatchesScalarReference) {
  if (!q4_bf16_available()) GTEST_SKIP() << "this build has no AVX-512 BF16 kernel";
  unsigned seed = 1;
  for (const Case& c : kCases) {
    std::vector<float> wd;
    const Quant4Tensor q = make(c, seed++, &wd);
    ASSERT_TRUE(q4_bf16_supported(q));
    const Q4Panels p = pack_q4_panels(q);
    for (int64_t m : {1, 3, 8, 13, 21}) {
      const auto x = random_x(m, c.cols, seed++);
      std::vector<float> y(m * c.rows, NAN), ref(m * c.rows, NAN);
      q4_bf16_matmul(x.data(), m, p, y.data());
      q4_bf16_matmul_reference(x.data(), m, p, ref.data());
      double err = 0.0, norm = 0.0;
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << "at " << i;
        err = std::max(err, std::fabs(static_cast<double>(y[i]) - ref[i]));
        norm = std::max(norm, std::fabs(static_cast<double>(ref[i])));
      }
      EXPECT_LE(err, 1e-5 * norm) << "rows " << c.rows << " cols " << c.cols << " m " << m;
    }
  }
}

// The bf16 path's error against the exact product: activations and code values rounded to bf16
// (relative 2^-9 each) and absmax to f16 give a relative error of a few 1e-3 on random data.
TEST(QuantMatmulBf16, CloseToDequantizedProduct) {
  unsigned seed = 100;
  for (const Case& c : kCases) {
    std::vector<float> wd;
    const Quant4Tensor q = make(c, seed++, &wd);
    const Q4Panels p = pack_q4_panels(q);
    const int64_t m = 3;
    const auto x = random_x(m, c.cols, seed++);
    std::vector<float> y(m * c.rows);
    q4_bf16_matmul_reference(x.data(), m, p, y.data());
    double err = 0.0, norm = 0.0;
    for (int64_t j = 0; j < m; ++j)
      for (int64_t r = 0; r < c.rows; ++r) {
        double s = 0.0;
        for (int64_t k = 0; k < c.cols; ++k) s += static_cast<double>(x[j * c.cols + k]) * wd[r * c.cols + k];
        err += (y[j * c.rows + r] - s) * (y[j * c.rows + r] - s);
        norm += s * s;
      }
    EXPECT_LT(std::sqrt(err / norm), 4e-3) << "rows " << c.rows << " cols " << c.cols;
    EXPECT_GT(std::sqrt(err / norm), 0.0) << "a zero error would mean the bf16 rounding was not applied";
  }
}

TEST(QuantMatmulBf16, RowsDoNotDependOnBatching) {
  if (!q4_bf16_available()) GTEST_SKIP() << "this build has no AVX-512 BF16 kernel";
  std::vector<float> wd;
  const Case c{80, 512, 64, QuantType::NF4, true};
  const Q4Panels p = pack_q4_panels(make(c, 7, &wd));
  const int64_t m = 19;  // two full tiles of 8 and a tail of 3
  const auto x = random_x(m, c.cols, 8);
  std::vector<float> all(m * c.rows), one(c.rows);
  q4_bf16_matmul(x.data(), m, p, all.data());
  for (int64_t j = 0; j < m; ++j) {
    q4_bf16_matmul(x.data() + j * c.cols, 1, p, one.data());
    for (int64_t r = 0; r < c.rows; ++r) ASSERT_EQ(all[j * c.rows + r], one[r]) << "row " << j << " out " << r;
  }
}

TEST(QuantMatmulBf16, UnsupportedShapeIsRefused) {
  std::vector<float> wd;
  const Quant4Tensor q = make(Case{4, 96, 64, QuantType::NF4, false}, 3, &wd);
  EXPECT_FALSE(q4_bf16_supported(q));  // 96 columns: not a whole number of 64-element chunks
}

// Several products in one parallel pass (a mixture's experts): each equal, bit for bit, to the same
// product alone.
TEST(QuantMatmulBf16, GroupEqualsEachProductAlone) {
  if (!q4_bf16_available()) GTEST_SKIP() << "this build has no AVX-512 BF16 kernel";
  std::vector<float> wd;
  const Case cs[] = {{48, 128, 64, QuantType::NF4, true}, {37, 256, 64, QuantType::NF4, false}, {16, 64, 32, QuantType::FP4, false}};
  std::vector<Q4Panels> ps;
  for (int i = 0; i < 3; ++i) ps.push_back(pack_q4_panels(make(cs[i], 40 + unsigned(i), &wd)));
  const int64_t ms[] = {1, 5, 0};
  std::vector<std::vector<float>> xs, ys, alone;
  std::vector<Q4Product> group;
  for (int i = 0; i < 3; ++i) {
    xs.push_back(random_x(std::max<int64_t>(ms[i], 1), cs[i].cols, 50 + unsigned(i)));
    ys.emplace_back(size_t(std::max<int64_t>(ms[i], 1) * cs[i].rows), NAN);
    alone.emplace_back(size_t(std::max<int64_t>(ms[i], 1) * cs[i].rows), NAN);
    group.push_back({xs[size_t(i)].data(), ms[i], &ps[size_t(i)], ys[size_t(i)].data()});
    q4_bf16_matmul(xs[size_t(i)].data(), ms[i], ps[size_t(i)], alone[size_t(i)].data());
  }
  q4_bf16_matmul_group(group.data(), 3);
  for (int i = 0; i < 2; ++i)
    for (size_t k = 0; k < ys[size_t(i)].size(); ++k) ASSERT_EQ(ys[size_t(i)][k], alone[size_t(i)][k]) << i << " " << k;
  EXPECT_TRUE(std::isnan(ys[2][0])) << "a product of 0 rows writes nothing";
}
