// cpu_matmul_q4 against dequantize + a naive double-precision matmul, on random inputs with odd
// sizes: m = 1..5 (register-decoded path and its edge), 17, 70 (more than one x tile), blocks spanning rows, odd cols, plain and double
// quant, NF4 and FP4, weights rounded to bf16 or not; decode rows equal to batched rows bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/matmul_q4.h"
#include "core/error.h"
#include "quant/blockwise.h"

using namespace nf4flash;

namespace {

void check(int64_t rows, int64_t cols, int blocksize, QuantType t, bool dq, bool prepared,
           unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(rows * cols);
  for (float& v : w) v = 0.3f * nd(rng);
  Quant4Tensor q = quantize_4bit(w.data(), DType::F32, rows, cols, t, blocksize, dq);
  if (prepared) quant4_prepare(q);
  std::vector<float> wd(rows * cols);
  dequantize_4bit(q, wd.data());
  for (bool bf16 : {false, true}) {
    for (int64_t m : {1, 2, 3, 4, 5, 17, 70}) {
      std::vector<float> x(m * cols), y(m * rows, NAN);
      for (float& v : x) v = nd(rng);
      cpu_matmul_q4(x.data(), m, q, y.data(), bf16);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0.0, mag = 0.0;
          for (int64_t k = 0; k < cols; ++k) {
            const float wv = bf16 ? round_bf16(wd[r * cols + k]) : wd[r * cols + k];
            s += static_cast<double>(x[i * cols + k]) * wv;
            mag += std::fabs(static_cast<double>(x[i * cols + k]) * wv);
          }
          ASSERT_NEAR(y[i * rows + r], s, 2e-6 * mag + 1e-6)
              << "rows " << rows << " cols " << cols << " bs " << blocksize << " m " << m
              << " bf16 " << bf16 << " at [" << i << ", " << r << "]";
        }
      }
    }
  }
}

}  // namespace

TEST(QuantMatmul, MatchesDequantizedNaive) {
  check(64, 256, 64, QuantType::NF4, false, false, 1);
  check(37, 96, 64, QuantType::NF4, true, false, 2);   // blocks span rows
  check(37, 96, 64, QuantType::FP4, true, true, 3);    // with the expanded absmax cache
  check(5, 33, 32, QuantType::FP4, false, false, 4);   // odd cols: rows start mid-byte
  check(9, 7, 128, QuantType::NF4, true, false, 5);    // a block spans many rows
  check(9, 7, 128, QuantType::NF4, true, true, 7);
  check(130, 200, 256, QuantType::NF4, false, false, 6);
}

// The decode rows (m <= 4: weights decoded in registers, several weight rows interleaved) give
// each row exactly the sums of the batched path (m > 4: dequantized rows, blocked dot products):
// a row's result does not depend on how many rows share the call.
TEST(QuantMatmul, DecodeRowsEqualBatchedRows) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t rows = 13, cols = 256;  // 13: groups of 4 and 2 weight rows with a remainder
  std::vector<float> w(rows * cols);
  for (float& v : w) v = 0.3f * nd(rng);
  for (bool dq : {false, true}) {
    Quant4Tensor q = quantize_4bit(w.data(), DType::F32, rows, cols, QuantType::NF4, 64, dq);
    if (dq) quant4_prepare(q);
    for (bool bf16 : {false, true}) {
      std::vector<float> x(5 * cols), y5(5 * rows);
      for (float& v : x) v = nd(rng);
      cpu_matmul_q4(x.data(), 5, q, y5.data(), bf16);
      for (int64_t m = 1; m <= 4; ++m) {
        std::vector<float> y(m * rows);
        cpu_matmul_q4(x.data(), m, q, y.data(), bf16);
        for (int64_t i = 0; i < m * rows; ++i)
          ASSERT_EQ(y[i], y5[i]) << "dq " << dq << " bf16 " << bf16 << " m " << m << " at " << i;
      }
    }
  }
}

TEST(QuantMatmul, RoundsWeightsToBf16Exactly) {
  // One x row that is a unit vector picks out a weight column: y must equal the weights exactly.
  std::vector<float> w(12 * 40);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.1f * static_cast<float>(i)) * 0.7f;
  const Quant4Tensor q = quantize_4bit(w.data(), DType::F32, 12, 40, QuantType::NF4, 32, true);
  std::vector<float> wd(w.size());
  dequantize_4bit(q, wd.data());
  for (int64_t c = 0; c < 40; ++c) {
    std::vector<float> x(40, 0.0f), y(12), yb(12);
    x[c] = 1.0f;
    cpu_matmul_q4(x.data(), 1, q, y.data(), false);
    cpu_matmul_q4(x.data(), 1, q, yb.data(), true);
    for (int64_t r = 0; r < 12; ++r) {
      ASSERT_EQ(y[r], wd[r * 40 + c]);
      ASSERT_EQ(yb[r], round_bf16(wd[r * 40 + c]));
    }
  }
}

TEST(QuantMatmul, RejectsInconsistentWeight) {
  std::vector<float> w(8 * 64, 0.5f);
  Quant4Tensor q = quantize_4bit(w.data(), DType::F32, 8, 64, QuantType::NF4, 64, false);
  std::vector<float> x(64, 1.0f), y(8);
  q.absmax.pop_back();
  EXPECT_THROW(cpu_matmul_q4(x.data(), 1, q, y.data()), Error);
}
