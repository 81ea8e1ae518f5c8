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

TEST(KvCache, PromptLongerThanContextIsAnError) {
  auto e = load("llama-gqa-hd64", true);
  std::vector<int32_t> prompt(300, 5);
  GenerateOptions go;
  go.max_new_tokens = 1;
  EXPECT_THROW(e->generate(prompt, go), Error);
}

}  // namespace
