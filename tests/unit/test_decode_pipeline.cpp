// The pipelined decode loop (Engine::Impl::pipeline: each step queued before the host has the
// token it consumes, Backend::sample_to_device) against the synchronous one on the CPU backend,
// which runs the same interface in the call: the same tokens, stop reasons and counts for every
// way generation ends (length, EOS, callback, context), for greedy and seeded sampling; the cache
// reused after a stop that left a step computed in vain; the repetition penalty stays synchronous.
// The CUDA form (where it is the default) runs in tests/ops/test_model_gpu.cpp.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"
#include "nf4flash/engine.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

std::unique_ptr<Engine> load(int64_t ctx = 256) {
  LoadOptions o;
  o.model_dir = model_dir("llama-gqa-hd64");
  o.device = DeviceChoice::CPU;
  o.compute = ComputeDType::F32;
  o.ctx_size = ctx;
  o.load_tokenizer = false;
  return Engine::load(o);
}

// generate() on `e` with the loop given, from a cold cache unless `reuse`
GenerateResult gen(Engine& e, bool pipelined, const std::vector<int32_t>& prompt, GenerateOptions g,
                   const TokenFn& cb = nullptr) {
  e.internals().pipeline = pipelined;
  return e.generate(prompt, g, cb);
}

// n tokens past any EOS, from a cold cache
GenerateOptions cold_run(int n) {
  GenerateOptions g;
  g.max_new_tokens = n;
  g.ignore_eos = true;
  g.reuse_cache = false;
  return g;
}

void expect_same(const GenerateResult& a, const GenerateResult& b, const char* what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_EQ(a.stop_reason, b.stop_reason) << what;
  EXPECT_EQ(a.timing.decode_tokens, b.timing.decode_tokens) << what;
}

TEST(DecodePipeline, CpuDefaultIsSynchronousAndTheInterfaceWorks) {
  auto e = load();
  EXPECT_FALSE(e->internals().pipeline);  // CPU: a step queued ahead would only be computed in vain
  EXPECT_FALSE(e->report().decode_pipelined);
  e->internals().pipeline = true;
  EXPECT_TRUE(e->internals().pipelined());
  e->internals().opts.use_cache = false;  // --no-cache recomputes the context on the host's turn
  EXPECT_FALSE(e->internals().pipelined());
}

TEST(DecodePipeline, SameTokensForEveryStop) {
  Golden gd("llama-gqa-hd64");
  const auto prompt = gd.i32("tokens_1");  // 33 tokens
  auto e = load();
  GenerateOptions g = cold_run(14);
  const GenerateResult sync_len = gen(*e, false, prompt, g), pipe_len = gen(*e, true, prompt, g);
  expect_same(sync_len, pipe_len, "length");
  ASSERT_EQ(sync_len.tokens.size(), 14u);
  EXPECT_EQ(sync_len.stop_reason, "length");

  // a stop id first generated at index 6: both stop there (the pipelined loop has queued one more step)
  GenerateOptions gs = g;
  gs.ignore_eos = false;
  gs.stop_ids = {sync_len.tokens[6]};
  const GenerateResult sync_eos = gen(*e, false, prompt, gs), pipe_eos = gen(*e, true, prompt, gs);
  expect_same(sync_eos, pipe_eos, "eos");
  EXPECT_EQ(pipe_eos.stop_reason, "eos");
  EXPECT_LE(pipe_eos.tokens.size(), 7u);

  // the callback stops after 4 tokens
  int seen = 0;
  auto cb = [&](int32_t) { return ++seen < 4; };
  const GenerateResult sync_cb = gen(*e, false, prompt, g, cb);
  seen = 0;
  const GenerateResult pipe_cb = gen(*e, true, prompt, g, cb);
  expect_same(sync_cb, pipe_cb, "callback");
  EXPECT_EQ(pipe_cb.stop_reason, "callback");
  EXPECT_EQ(pipe_cb.tokens.size(), 4u);

  // max_new_tokens 1 and 2: no step or one step
  for (int m : {1, 2}) {
    GenerateOptions gm = g;
    gm.max_new_tokens = m;
    expect_same(gen(*e, false, prompt, gm), gen(*e, true, prompt, gm), "short");
  }
}

TEST(DecodePipeline, ContextLimitStopsAtTheSameToken) {
  Golden gd("llama-gqa-hd64");
  const auto prompt = gd.i32("tokens_1");  // 33 tokens; context 40: 7 steps after the prefill
  auto e = load(40);
  GenerateOptions g = cold_run(30);
  const GenerateResult a = gen(*e, false, prompt, g), b = gen(*e, true, prompt, g);
  expect_same(a, b, "context");
  EXPECT_EQ(b.stop_reason, "context");
  // every position holds a token's K/V; the last token sampled is not in the cache
  EXPECT_EQ(static_cast<int64_t>(prompt.size() + b.tokens.size()), 41);
}

TEST(DecodePipeline, SeededSamplingDrawsTheSameTokens) {
  Golden gd("llama-gqa-hd64");
  const auto prompt = gd.i32("tokens_0");
  auto e = load();
  GenerateOptions g = cold_run(16);
  g.sampling.temperature = 1.3f;
  g.sampling.top_k = 40;
  g.sampling.top_p = 0.95f;
  g.sampling.seed = 1234;
  const GenerateResult a = gen(*e, false, prompt, g), b = gen(*e, true, prompt, g);
  expect_same(a, b, "sampled");
  // the tokens are draws, not the greedy path (else this test would not test the uniforms' order)
  GenerateOptions gg = g;
  gg.sampling.temperature = 0.0f;
  EXPECT_NE(gen(*e, false, prompt, gg).tokens, a.tokens);
}

// The repetition penalty's history lives on the device in the pipelined loop (prompt and token 0
// uploaded once, each sampled id appended): the same tokens as the host history gives, greedy and
// sampled, and the penalty does change them (else the history would not be tested).
TEST(DecodePipeline, RepetitionPenaltyHistoryOnTheDevice) {
  Golden gd("llama-gqa-hd64");
  const auto prompt = gd.i32("tokens_1");
  auto e = load();
  GenerateOptions g = cold_run(24);
  const GenerateResult plain = gen(*e, false, prompt, g);
  g.sampling.repeat_penalty = 5.0f;
  const GenerateResult a = gen(*e, false, prompt, g), b = gen(*e, true, prompt, g);
  expect_same(a, b, "penalty greedy");
  EXPECT_NE(a.tokens, plain.tokens);
  g.sampling.temperature = 0.9f;
  g.sampling.seed = 5;
  expect_same(gen(*e, false, prompt, g), gen(*e, true, prompt, g), "penalty sampled");
}

// A pipelined generation that stops on EOS leaves a step computed in vain (it consumed the last
// token); the next turn reuses the cache as claimed and continues exactly as a synchronous engine.
TEST(DecodePipeline, CacheReuseAfterAStopIsExact) {
  Golden gd("llama-gqa-hd64");
  const auto prompt = gd.i32("tokens_1");
  auto ref = load(), e = load();
  GenerateOptions g;
  g.max_new_tokens = 12;
  g.ignore_eos = true;
  const GenerateResult probe = gen(*ref, false, prompt, g);
  GenerateOptions gs = g;
  gs.ignore_eos = false;
  gs.stop_ids = {probe.tokens[5]};
  const GenerateResult r1 = gen(*ref, false, prompt, gs), p1 = gen(*e, true, prompt, gs);
  expect_same(r1, p1, "turn 1");
  std::vector<int32_t> turn2 = prompt;
  turn2.insert(turn2.end(), p1.tokens.begin(), p1.tokens.end());
  turn2.push_back(7);
  turn2.push_back(11);
  const GenerateResult r2 = gen(*ref, false, turn2, g), p2 = gen(*e, true, turn2, g);
  expect_same(r2, p2, "turn 2");
  EXPECT_EQ(p2.timing.cached_tokens, r2.timing.cached_tokens);
  EXPECT_GE(p2.timing.cached_tokens, static_cast<int64_t>(prompt.size()));
}

TEST(DecodePipeline, BenchDecodeRunsPipelined) {
  auto e = load();
  e->internals().pipeline = true;
  EXPECT_GT(e->bench_decode(3, 10), 0.0);
  e->internals().pipeline = false;
  EXPECT_GT(e->bench_decode(3, 10), 0.0);
}

TEST(DecodePipeline, EnvSwitchIsCheckedAtLoad) {
  ::setenv("NF4FLASH_DECODE_PIPELINE", "1", 1);
  auto on = load();
  ::setenv("NF4FLASH_DECODE_PIPELINE", "yes", 1);
  try {
    load();
    ADD_FAILURE() << "NF4FLASH_DECODE_PIPELINE=yes accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("NF4FLASH_DECODE_PIPELINE=yes"), std::string::npos) << err.what();
  }
  ::unsetenv("NF4FLASH_DECODE_PIPELINE");
  EXPECT_TRUE(on->internals().pipeline);
  EXPECT_TRUE(on->report().decode_pipelined);
}

}  // namespace
