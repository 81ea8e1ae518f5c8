// Tensor-parallel sharding below the decoder: the layout of a rank (balanced ranges, kv heads
// replicated for GQA with fewer kv heads than ranks, refusals naming the shape) and the 4-bit row
// and column cuts a rank keeps (their values are those of the whole tensor, bit for bit, with and
// without double quant; cuts inside a block are refused).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "model/tp_layout.h"
#include "model/weight_loader.h"
#include "parallel/communicator.h"
#include "quant/blockwise.h"

using namespace nf4flash;

namespace {

ModelConfig heads_config(int nh, int nkv, int64_t inter = 256) {
  ModelConfig c;
  c.source = "config.json";
  c.n_heads = nh;
  c.n_kv_heads = nkv;
  c.head_dim = 64;
  c.hidden_size = 256;
  c.intermediate_size = inter;
  c.vocab_size = 1000;
  return c;
}

TpLayout layout_of(const ModelConfig& c, int rank, int world, InProcessGroup& g) {
  return tp_layout(c, TpShard{rank, world, &g.comm(rank)});
}

TEST(TpLayout, BalancedRangesAndKvHeadsOfEachRank) {
  InProcessGroup g4(4);
  // 8 q heads over 4 kv heads: two q heads and their one kv head per rank
  for (int r = 0; r < 4; ++r) {
    const TpLayout l = layout_of(heads_config(8, 4), r, 4, g4);
    EXPECT_EQ(l.q_heads.begin, 2 * r);
    EXPECT_EQ(l.q_heads.n, 2);
    EXPECT_EQ(l.kv_heads.begin, r);
    EXPECT_EQ(l.kv_heads.n, 1);
    EXPECT_EQ(l.inter.begin, 64 * r);
    EXPECT_EQ(l.vocab.begin, 250 * r);
  }
  // 4 q heads over 2 kv heads on 4 ranks: each kv head replicated on the two ranks reading it
  for (int r = 0; r < 4; ++r) {
    const TpLayout l = layout_of(heads_config(4, 2), r, 4, g4);
    EXPECT_EQ(l.q_heads.begin, r);
    EXPECT_EQ(l.kv_heads.begin, r / 2);
    EXPECT_EQ(l.kv_heads.n, 1);
  }
  // 2 q heads on 4 ranks: ranks 1 and 3 hold one each, ranks 0 and 2 none (and no kv heads)
  const int want_q[4] = {0, 1, 0, 1};
  for (int r = 0; r < 4; ++r) {
    const TpLayout l = layout_of(heads_config(2, 1), r, 4, g4);
    EXPECT_EQ(l.q_heads.n, want_q[r]) << r;
    EXPECT_EQ(l.kv_heads.n, want_q[r]) << r;
  }
  EXPECT_TRUE(layout_of(heads_config(2, 1), 3, 4, g4).bias_rank());
  // unsharded: everything
  const TpLayout one = tp_layout(heads_config(8, 2), TpShard{});
  EXPECT_EQ(one.q_heads.n, 8);
  EXPECT_EQ(one.kv_heads.n, 2);
  EXPECT_EQ(one.inter.n, 256);
  EXPECT_FALSE(one.sharded());
}

TEST(TpLayout, RefusesWhatCannotBeSharded) {
  InProcessGroup g3(3), g4(4);
  // 8 q heads over 4 kv heads on 3 ranks: rank 1 holds q heads 2..4, reading kv heads 1, 1, 2
  try {
    layout_of(heads_config(8, 4), 1, 3, g3);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not read its kv heads 1..2 as one uniform grouping"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(layout_of(heads_config(4, 2, 3), 0, 4, g4), Error);  // intermediate 3 < 4 ranks
  EXPECT_THROW(tp_layout(heads_config(4, 2), TpShard{0, 2, nullptr}), Error);  // no communicator
  EXPECT_THROW(tp_layout(heads_config(4, 2), TpShard{1, 4, &g4.comm(2)}), Error);  // another rank's
}

Quant4Tensor random_quant4(int64_t rows, int64_t cols, QuantType t, bool dq, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(size_t(rows * cols));
  for (auto& x : w) x = nd(rng) * (rng() % 17 == 0 ? 20.0f : 1.0f);
  Quant4Options o;
  o.type = t;
  o.double_quant = dq;
  return quantize_4bit(w.data(), DType::F32, rows, cols, o);
}

std::vector<float> dequant(const Quant4Tensor& q) {
  std::vector<float> v(size_t(q.numel()));
  dequantize_4bit(q, v.data());
  return v;
}

// The cuts TP ranks hold dequantize to exactly the matching values of the whole tensor (double
// quant too: the cut carries the expanded absmax, which is what dequantizing the whole computes).
TEST(Quant4Cut, RowAndColumnCutsDequantizeToTheWhole) {
  const int64_t rows = 48, cols = 512;  // 8 blocks per row; 384 blocks: more than one nested block
  for (QuantType t : {QuantType::NF4, QuantType::FP4}) {
    for (bool dq : {false, true}) {
      const Quant4Tensor q = random_quant4(rows, cols, t, dq, 5);
      const std::vector<float> whole = dequant(q);
      const Quant4Tensor rc = quant4_rows(q, 20, 12);
      const std::vector<float> rv = dequant(rc);
      ASSERT_EQ(rc.rows, 12);
      EXPECT_EQ(std::memcmp(rv.data(), whole.data() + 20 * cols, rv.size() * 4), 0) << "rows, dq " << dq;
      for (int64_t c0 : {int64_t{0}, int64_t{128}, int64_t{448}}) {
        const Quant4Tensor cc = quant4_cols(q, c0, 64);
        ASSERT_EQ(cc.cols, 64);
        const std::vector<float> cv = dequant(cc);
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(std::memcmp(cv.data() + r * 64, whole.data() + r * cols + c0, 64 * 4), 0)
              << "column cut at " << c0 << ", row " << r << ", dq " << dq;
      }
    }
  }
}

TEST(Quant4Cut, RefusesCutsInsideABlock) {
  const Quant4Tensor q = random_quant4(8, 192, QuantType::NF4, false, 3);
  EXPECT_THROW(quant4_cols(q, 32, 64), Error);   // starts inside a block
  EXPECT_THROW(quant4_cols(q, 0, 96), Error);    // ends inside one
  const Quant4Tensor odd = random_quant4(8, 96, QuantType::NF4, false, 3);  // blocks cross the rows
  EXPECT_THROW(quant4_cols(odd, 0, 64), Error);
  EXPECT_NO_THROW(quant4_cols(q, 64, 128));
}

}  // namespace
