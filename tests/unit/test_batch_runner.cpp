// Continuous batching on the CPU (BatchRunner): prompts joining and leaving a batch smaller than
// their number, some sharing a prefix (prefix-cache hits), greedy and seeded sampling with stop
// ids and max_new_tokens, give each request exactly the tokens Engine::generate gives it alone;
// a tiny pool makes requests wait and be preempted with the same results; every block is back
// after the run, and the engine's own generate runs on the contiguous cache again; samples of one
// prompt submitted together compute it once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "nf4flash/engine.h"
#include "runtime/batch_runner.h"
#include "test_util.h"

namespace nf4flash {
namespace {

std::unique_ptr<Engine> load_cpu(const std::string& model, QuantChoice quant) {
  return test::load_cpu_engine(model, quant, 128);
}

struct Case {
  std::vector<int32_t> prompt;
  GenerateOptions gen;
};

std::vector<Case> cases(int64_t V) {
  std::vector<Case> cs;
  const std::vector<int32_t> shared = {5, 17, 29, 41, 53, 65, 77, 89, 101};  // a common prefix of 9 tokens
  for (int i = 0; i < 7; ++i) {
    Case c;
    if (i % 2 == 0) c.prompt = shared;
    for (int k = 0; k < 3 + 4 * i; ++k) c.prompt.push_back(int32_t((13 + 37 * k + 211 * i) % (V - 1) + 1));
    c.gen.max_new_tokens = 3 + i % 4 * 3;
    c.gen.ignore_eos = true;
    if (i % 3 == 1) {  // seeded sampling
      c.gen.sampling.temperature = 0.9f;
      c.gen.sampling.top_p = 0.9f;
      c.gen.sampling.seed = uint64_t(100 + i);
    }
    cs.push_back(c);
  }
  cs[3].gen.max_new_tokens = 0;
  return cs;
}

void expect_batched_equals_alone(const std::string& model, QuantChoice quant, const BatchRunnerOptions& o,
                                 bool expect_hits = true) {
  SCOPED_TRACE(model);
  auto e = load_cpu(model, quant);
  const std::vector<Case> cs = cases(e->vocab_size());
  std::vector<GenerateResult> alone;
  for (const Case& c : cs) {
    GenerateOptions g = c.gen;
    g.reuse_cache = false;
    alone.push_back(e->generate(c.prompt, g));
  }
  // a stop id taken from one request's own output makes it stop there
  std::vector<Case> bs = cs;
  ASSERT_GE(alone[2].tokens.size(), 3u);
  bs[2].gen.ignore_eos = false;
  bs[2].gen.stop_ids = {alone[2].tokens[1]};
  std::map<int64_t, BatchOutput> got;
  {
    BatchRunner r(*e, o);
    // the first four at once, the rest after a few steps (when the shared prefix is cached)
    for (size_t i = 0; i < bs.size(); ++i) {
      if (i == 4)
        for (int step = 0; step < 4; ++step)
          for (BatchOutput& out : r.step()) got[out.id] = std::move(out);
      const SubmitResult s = r.submit({int64_t(i), bs[i].prompt, bs[i].gen});
      ASSERT_TRUE(s.ok()) << s.error;
    }
    for (int step = 0; r.has_work() && step < 1000; ++step)
      for (BatchOutput& out : r.step()) got[out.id] = std::move(out);
    EXPECT_FALSE(r.has_work());
    EXPECT_EQ(r.pool().available_blocks(), r.pool().n_blocks()) << "blocks leaked";
    EXPECT_GT(r.pool().cached_blocks(), 0);
    EXPECT_GT(r.scheduler().stats().steps, int64_t(cs.size()));
    if (!expect_hits) EXPECT_GT(r.scheduler().stats().preemptions, 0) << "the tiny pool never preempted";
  }
  ASSERT_EQ(got.size(), cs.size());
  for (size_t i = 0; i < cs.size(); ++i) {
    const BatchOutput& b = got.at(int64_t(i));
    if (i == 2) {  // up to the first occurrence of its stop id
      const auto stop = std::find(alone[2].tokens.begin(), alone[2].tokens.end(), alone[2].tokens[1]);
      EXPECT_EQ(b.tokens, std::vector<int32_t>(alone[2].tokens.begin(), stop + 1)) << "request 2";
      EXPECT_EQ(b.finish_reason, "stop");
      continue;
    }
    EXPECT_EQ(b.tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(b.finish_reason, "length") << "request " << i;
    EXPECT_EQ(b.prompt_tokens, int64_t(cs[i].prompt.size()));
  }
  if (expect_hits) EXPECT_GT(got.at(4).cached_tokens + got.at(6).cached_tokens, 0) << "no prefix-cache hit";
  // the engine's own generate works again afterwards (the contiguous cache is back)
  GenerateOptions g = cs[0].gen;
  g.reuse_cache = false;
  EXPECT_EQ(e->generate(cs[0].prompt, g).tokens, alone[0].tokens);
}

BatchRunnerOptions runner_options(int block_size, int max_seqs, int max_tokens) {
  BatchRunnerOptions o;
  o.block_size = block_size;
  o.sched.max_seqs_per_step = max_seqs;
  o.sched.max_tokens_per_step = max_tokens;
  return o;
}

TEST(BatchRunner, JoinLeaveAndPrefixHitsGiveTheTokensOfEachAloneF32) {
  expect_batched_equals_alone("llama-gqa-hd64", QuantChoice::Auto, runner_options(4, 3, 16));
}

TEST(BatchRunner, JoinLeaveAndPrefixHitsGiveTheTokensOfEachAloneNf4) {
  expect_batched_equals_alone("llama3-hd128-ropescaled", QuantChoice::NF4, runner_options(8, 2, 64));
}

// A mixture of experts (each row's experts, gathered per expert), Phi-3's fused projections with
// LongRoPE and Gemma's sliding-window layers batch the same way: every request gets the tokens it
// gets alone.
TEST(BatchRunner, MoePhi3AndGemmaGiveTheTokensOfEachAlone) {
  const BatchRunnerOptions o = runner_options(4, 3, 16);
  expect_batched_equals_alone("qwen3moe-topk", QuantChoice::NF4, o);
  expect_batched_equals_alone("mixtral-moe", QuantChoice::Auto, o);
  expect_batched_equals_alone("phi3-longrope-hd96", QuantChoice::Auto, o);
  expect_batched_equals_alone("gemma2-hd256-softcap", QuantChoice::NF4, o);
  expect_batched_equals_alone("gemma3-qknorm-window", QuantChoice::Auto, o);
}

TEST(BatchRunner, TinyPoolWaitsAndPreemptsWithTheSameResults) {
  BatchRunnerOptions o;
  o.block_size = 4;
  o.n_blocks = 12;  // 48 positions for 7 requests of up to ~46
  o.sched.max_seqs_per_step = 4;
  o.sched.max_tokens_per_step = 16;
  expect_batched_equals_alone("llama-gqa-hd64", QuantChoice::Auto, o, /*expect_hits=*/false);
}

TEST(BatchRunner, TokenLogprobsAreTheLogSoftmax) {
  const float l[] = {1.f, 3.f, 2.f, 3.f};
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  const TokenLogprobs r = token_logprobs(l, 4, 2, 3);
  EXPECT_NEAR(r.logprob, 2.0 - lse, 1e-6);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].first, 1);  // ties: the lower id first
  EXPECT_EQ(r.top[1].first, 3);
  EXPECT_EQ(r.top[2].first, 2);
  EXPECT_NEAR(r.top[0].second, 3.0 - lse, 1e-6);
  EXPECT_TRUE(token_logprobs(l, 4, 0, 0).top.empty());
}

// A request that asks for log-probabilities gets them for each token, during on_token, and those
// of a greedy pick are the top-1's; one that does not ask gets none.
TEST(BatchRunner, StepLogprobsForTheRequestsThatAsk) {
  auto e = load_cpu("llama-gqa-hd64", QuantChoice::Auto);
  BatchRunner* rp = nullptr;
  int with = 0, without = 0;
  BatchRunnerOptions o;
  o.block_size = 4;
  o.on_token = [&](int64_t id, int32_t t) {
    const TokenLogprobs* lp = rp->step_logprobs(id);
    if (id == 1) {
      EXPECT_TRUE(lp && lp->top.size() == 2 && lp->top[0].first == t && lp->top[0].second == lp->logprob && lp->logprob <= 0);
      ++with;
    } else {
      EXPECT_EQ(lp, nullptr);
      ++without;
    }
    return true;
  };
  BatchRunner r(*e, o);
  rp = &r;
  GenerateOptions g;
  g.max_new_tokens = 5;
  g.ignore_eos = true;
  ASSERT_TRUE(r.submit({1, {5, 9, 13}, g, 2}).ok());
  ASSERT_TRUE(r.submit({2, {7, 11}, g}).ok());
  for (int s = 0; r.has_work() && s < 100; ++s) r.step();
  EXPECT_EQ(with, 5);
  EXPECT_EQ(without, 5);
}

// n samples of one prompt submitted together: the first computes the prompt, the others wait for
// its blocks and take them from the prefix cache (12 of their 13 prompt positions), and each gets
// the tokens it gets alone; a waiting one that is cancelled ends with "abort" and holds nothing.
TEST(BatchRunner, SamplesOfOnePromptShareItsPrefill) {
  auto e = load_cpu("llama-gqa-hd64", QuantChoice::Auto);
  const std::vector<int32_t> prompt = {5, 17, 29, 41, 53, 65, 77, 89, 101, 3, 8, 13, 21};
  std::vector<GenerateOptions> gens(4);
  std::vector<GenerateResult> alone;
  for (size_t i = 0; i < gens.size(); ++i) {
    gens[i].max_new_tokens = 6;
    gens[i].ignore_eos = true;
    gens[i].sampling.temperature = 0.8f;
    gens[i].sampling.seed = 40 + i;
    GenerateOptions g = gens[i];
    g.reuse_cache = false;
    alone.push_back(e->generate(prompt, g));
  }
  BatchRunnerOptions o;
  o.block_size = 4;
  o.sched.max_seqs_per_step = 8;
  o.sched.max_tokens_per_step = 64;
  std::map<int64_t, BatchOutput> got;
  int64_t rows = 0;
  {
    BatchRunner r(*e, o);
    for (size_t i = 0; i < gens.size(); ++i) ASSERT_TRUE(r.submit({int64_t(i), prompt, gens[i]}).ok());
    ASSERT_TRUE(r.submit({9, prompt, gens[0]}).ok());
    EXPECT_TRUE(r.cancel(9));
    for (int s = 0; r.has_work() && s < 100; ++s) {
      for (BatchOutput& out : r.step()) got[out.id] = std::move(out);
      rows += r.last_step().rows;
    }
    EXPECT_EQ(r.pool().available_blocks(), r.pool().n_blocks()) << "blocks leaked";
  }
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got.at(9).finish_reason, "abort");
  EXPECT_TRUE(got.at(9).tokens.empty());
  for (size_t i = 0; i < gens.size(); ++i) {
    EXPECT_EQ(got.at(int64_t(i)).tokens, alone[i].tokens) << "request " << i;
    EXPECT_EQ(got.at(int64_t(i)).cached_tokens, i == 0 ? 0 : 12) << "request " << i;
  }
  // the prompt computed once, then one position for each other sample's last prompt token, then
  // 5 decode steps of 4 rows
  EXPECT_EQ(rows, 13 + 3 + 5 * 4);
}

}  // namespace
}  // namespace nf4flash
