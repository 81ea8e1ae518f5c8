// Incremental decode with the KV cache must give the same logits as a full forward over the same
// tokens; --no-cache must give the same tokens as the cached path.
#include <gtest/gtest.h>

#include "nf4flash/engine.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

std::unique_ptr<Engine> load(const std::string& name, bool cache, int64_t ubatch = 512) {
  LoadOptions o;
  o.model_dir = model_dir(name);
  o.device = DeviceChoice::CPU;
  o.compute = ComputeDType::F32;
  o.ctx_size = 256;
  o.use_cache = cache;
  o.ubatch = ubatch;
  o.load_tokenizer = false;
  return Engine::load(o);
}

TEST(KvCache, IncrementalDecodeEqualsFullForward) {
  for (const char* name : {"llama-gqa-hd64", "qwen2-bias"}) {
    Golden g(name);
    const auto toks = g.i32("tokens_1");  // 33 tokens
    auto e = load(name, true);
    const ScoreResult full = e->score(toks, false, true);
    auto& im = e->internals();
    const int64_t V = e->vocab_size(), k = 5;
    std::vector<float> row(V);
    im.forward_tokens(toks.data(), k, 0, false, [](int64_t, Act) {});
    for (int64_t p = k; p < static_cast<int64_t>(toks.size()); ++p) {
      im.decode_step(toks[p], p);
      im.be->download(row.data(), im.logits_act(1).data, V * 4);
      EXPECT_LT(max_abs_diff(row, full.logits[p]), 1e-5 * 50) << name << " pos " << p;
      EXPECT_LT(rel_l2(row, full.logits[p]), 1e-5) << name << " pos " << p;
    }
  }
}

TEST(KvCache, ChunkedPrefillEqualsSingleChunk) {
  Golden g("llama3-hd128-ropescaled");
  const auto toks = g.i32("tokens_2");  // 200 tokens
  auto whole = load("llama3-hd128-ropescaled", true, 512);
  auto chunked = load("llama3-hd128-ropescaled", true, 37);
  const ScoreResult a = whole->score(toks, false, true), b = chunked->score(toks, false, true);
  EXPECT_LT(rel_l2(flatten(b.logits), flatten(a.logits)), 1e-5);
}

TEST(KvCache, NoCacheGivesSameTokens) {
  Golden g("llama-gqa-hd64");
  const auto prompt = g.i32("tokens_0");
  GenerateOptions go;
  go.max_new_tokens = 12;
  go.ignore_eos = true;
  auto cached = load("llama-gqa-hd64", true);
  auto uncached = load("llama-gqa-hd64", false);
  const auto a = cached->generate(prompt, go), b = uncached->generate(prompt, go);
  EXPECT_EQ(a.tokens.size(), 12u);
  EXPECT_EQ(a.tokens, b.tokens);
}

// Multi-turn: the second generate() re-sends turn 1 (prompt + reply) plus new tokens; only the
// part after the cached prefix runs, and the tokens equal a fresh engine's. A prompt that diverges
// early reuses only the shared part; score() in between invalidates the cache.
TEST(KvCache, ReusedPrefixGivesSameTokens) {
  Golden g("llama-gqa-hd64");
  const auto p1 = g.i32("tokens_0");
  const auto extra = g.i32("tokens_1");
  GenerateOptions go;
  go.max_new_tokens = 8;
  go.ignore_eos = true;
  auto e = load("llama-gqa-hd64", true);
  const GenerateResult r1 = e->generate(p1, go);
  EXPECT_EQ(r1.timing.cached_tokens, 0);
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), r1.tokens.begin(), r1.tokens.end());
  p2.insert(p2.end(), extra.begin(), extra.begin() + 10);
  const GenerateResult r2 = e->generate(p2, go);
  // everything but the last reply token (sampled, never run through the model) was cached
  EXPECT_EQ(r2.timing.cached_tokens, static_cast<int64_t>(p1.size() + r1.tokens.size() - 1));
  EXPECT_EQ(r2.timing.prompt_tokens, static_cast<int64_t>(p2.size()) - r2.timing.cached_tokens);
  GenerateOptions fresh = go;
  fresh.reuse_cache = false;
  auto ref = load("llama-gqa-hd64", true);
  const GenerateResult r2_ref = ref->generate(p2, fresh);
  EXPECT_EQ(r2_ref.timing.cached_tokens, 0);
  EXPECT_EQ(r2.tokens, r2_ref.tokens);

  std::vector<int32_t> p3(p2.begin(), p2.begin() + 3);  // diverges after 3 tokens
  p3.insert(p3.end(), extra.begin(), extra.begin() + 12);
  const GenerateResult r3 = e->generate(p3, go);
  EXPECT_EQ(r3.timing.cached_tokens, 3);
  EXPECT_EQ(r3.tokens, ref->generate(p3, fresh).tokens);

  e->score(p3);
  EXPECT_EQ(e->generate(p3, go).timing.cached_tokens, 0);
}

TEST(KvCache, PromptLongerThanContextIsAnError) {
  auto e = load("llama-gqa-hd64", true);
  std::vector<int32_t> prompt(300, 5);
  GenerateOptions go;
  go.max_new_tokens = 1;
  EXPECT_THROW(e->generate(prompt, go), Error);
}

}  // namespace
