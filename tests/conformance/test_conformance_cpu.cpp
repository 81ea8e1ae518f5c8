// CPU path vs the transformers goldens (shared/conformance, copied into tests/fixtures):
// f32 within 1e-4 relative; bf16 no further from f32 than twice transformers' own bf16 error;
// greedy continuation equal to transformers' generate().
#include <gtest/gtest.h>

#include "io/hf_config.h"
#include "nf4flash/engine.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {



std::unique_ptr<Engine> load_cpu(const std::string& dir, ComputeDType c, QuantChoice q = QuantChoice::Auto, bool dq = false) {
  LoadOptions o;
  o.model_dir = dir;
  o.device = DeviceChoice::CPU;
  o.compute = c;
  o.quant = q;
  o.double_quant = dq;
  o.ctx_size = 512;
  o.load_tokenizer = false;
  return Engine::load(o);
}

// The logits rows the golden keeps for sequence i: all 7 rows of sequence 0, else the last 4.
std::vector<float> golden_rows(const ScoreResult& r, int i) {
  return flatten(r.logits, i == 0 ? 0 : r.logits.size() - 4);
}

class CpuConformance : public ::testing::TestWithParam<const char*> {};

TEST_P(CpuConformance, F32MatchesTransformersF32) {
  const std::string name = GetParam();
  Golden g(name);
  auto e = load_cpu(model_dir(name), ComputeDType::F32);
  for (int i = 0; i < 3; ++i) {
    const auto toks = g.i32(cat("tokens_", i));
    const ScoreResult r = e->score(toks, false, true);
    const auto lp_ref = g.f32(cat("nextlogprob_f32_", i));
    const auto lg_ref = g.f32(cat("logits_f32_", i));
    EXPECT_LT(rel_l2(r.next_token_logprobs, lp_ref), 1e-4) << name << " seq " << i;
    EXPECT_LT(rel_l2(golden_rows(r, i), lg_ref), 1e-4) << name << " seq " << i;
  }
}

TEST_P(CpuConformance, Bf16WithinTwiceTransformersBf16Error) {
  const std::string name = GetParam();
  Golden g(name);
  auto e = load_cpu(model_dir(name), ComputeDType::BF16);
  for (int i = 0; i < 3; ++i) {
    const auto toks = g.i32(cat("tokens_", i));
    const ScoreResult r = e->score(toks, false, true);
    const auto lp32 = g.f32(cat("nextlogprob_f32_", i)), lp16 = g.f32(cat("nextlogprob_bf16_", i));
    const auto lg32 = g.f32(cat("logits_f32_", i)), lg16 = g.f32(cat("logits_bf16_", i));
    const double ref_lp = rel_l2(lp16, lp32), ref_lg = rel_l2(lg16, lg32);
    const double ours_lp = rel_l2(r.next_token_logprobs, lp32), ours_lg = rel_l2(golden_rows(r, i), lg32);
    EXPECT_LE(ours_lp, 2 * ref_lp) << name << " seq " << i << " (transformers bf16: " << ref_lp << ")";
    EXPECT_LE(ours_lg, 2 * ref_lg) << name << " seq " << i << " (transformers bf16: " << ref_lg << ")";
  }
}

TEST_P(CpuConformance, GreedyContinuationMatchesGenerate) {
  const std::string name = GetParam();
  Golden g(name);
  auto e = load_cpu(model_dir(name), ComputeDType::F32);
  const auto prompt = g.i32("tokens_1");
  const auto want = g.i32("greedy_f32_from_1");
  GenerateOptions go;
  go.max_new_tokens = static_cast<int>(want.size());
  go.ignore_eos = true;
  const GenerateResult r = e->generate(prompt, go);
  EXPECT_EQ(r.tokens, want) << name;
}

INSTANTIATE_TEST_SUITE_P(Models, CpuConformance, ::testing::ValuesIn(kConformanceModels),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (auto& c : s) if (c == '-') c = '_';
                           return s;
                         });

}  // namespace
