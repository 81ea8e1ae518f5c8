// Layers offloaded from the GPU to the CPU backend (--gpu-layers): on every conformance model
// CUDA runs, a split at every layer boundary against the model wholly on the GPU: the golden
// sequences' logits within the bf16 tolerance (twice transformers' own bf16-vs-f32 distance) and
// the same greedy ids, the GPU's parts of a decode step graphed or not; --gpu-layers 0 is the CPU backend's run exactly; 4-bit weights split too;
// batched requests over a split as each runs alone; a --max-vram below one layer is an error.
#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "cuda_test_util.h"
#include "nf4flash/engine.h"
#include "runtime/batch_runner.h"
#include "runtime/placement.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

// CUDA refuses dynamic NTK RoPE (CPU backend only): nothing to split
bool cuda_runs(const std::string& m) { return m != "llama-rope-dynamic"; }

LoadOptions options(const std::string& model, QuantChoice q, int gpu_layers) {
  LoadOptions o;
  o.model_dir = model_dir(model);
  o.device = DeviceChoice::CUDA;
  o.compute = ComputeDType::BF16;
  o.quant = q;
  o.double_quant = q != QuantChoice::None;
  o.ctx_size = 512;
  o.load_tokenizer = false;
  o.gpu_layers = gpu_layers;
  return o;
}

void expect_splits_match_gpu(const std::string& model, QuantChoice q) {
  Golden g(model);
  auto whole = Engine::load(options(model, q, kAllLayers));
  const int n = whole->config().n_layers;
  std::vector<std::vector<float>> want;
  for (int i = 0; i < 3; ++i) want.push_back(flatten(whole->score(g.i32(cat("tokens_", i)), false, true).logits));
  GenerateOptions gen;
  gen.max_new_tokens = 8;
  gen.ignore_eos = true;
  std::vector<int32_t> prompt = g.i32("tokens_0");
  prompt.resize(std::min<size_t>(prompt.size(), 12));
  const std::vector<int32_t> ids = whole->generate(prompt, gen).tokens;
  for (int k = 1; k < n; ++k) {
    SCOPED_TRACE(cat(model, " gpu_layers ", k));
    auto split = Engine::load(options(model, q, k));
    ASSERT_EQ(split->report().gpu_layers, k);
    ASSERT_EQ(split->report().offload_device, "cpu");
    for (int i = 0; i < 3; ++i) {
      const double tol = 2 * rel_l2(g.f32(cat("logits_bf16_", i)), g.f32(cat("logits_f32_", i)));
      EXPECT_LE(rel_l2(flatten(split->score(g.i32(cat("tokens_", i)), false, true).logits), want[size_t(i)]), tol) << "seq " << i;
    }
    const std::vector<int32_t> split_ids = split->generate(prompt, gen).tokens;
    EXPECT_EQ(split_ids, ids);
    if (k == 1) {  // the GPU's parts of each decode step as graphs or op by op: the same kernels
      EXPECT_TRUE(split->report().graphs);
      LoadOptions o = options(model, q, k);
      o.graphs = false;
      EXPECT_EQ(Engine::load(o)->generate(prompt, gen).tokens, split_ids);
    }
  }
}

}  // namespace

TEST(GpuOffload, EverySplitMatchesTheGpu) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kConformanceModels)
    if (cuda_runs(model)) expect_splits_match_gpu(model, QuantChoice::None);
}

TEST(GpuOffload, Nf4SplitsMatchTheGpu) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : {"llama-gqa-hd64", "qwen2-bias", "gemma2-hd256-softcap"})
    expect_splits_match_gpu(model, QuantChoice::NF4);
}

// No layer on the GPU: the CPU backend's run, bit for bit.
TEST(GpuOffload, ZeroGpuLayersIsTheCpuBackend) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : {"llama-gqa-hd64", "phi3-longrope-hd96"}) {
    SCOPED_TRACE(model);
    auto zero = Engine::load(options(model, QuantChoice::None, 0));
    LoadOptions c = options(model, QuantChoice::None, kAllLayers);
    c.device = DeviceChoice::CPU;
    auto cpu = Engine::load(c);
    EXPECT_EQ(zero->report().device, "cpu");
    EXPECT_EQ(zero->report().gpu_layers, 0);
    const std::vector<int32_t> toks = Golden(model).i32("tokens_1");
    EXPECT_EQ(zero->score(toks).next_token_logprobs, cpu->score(toks).next_token_logprobs);
  }
}

TEST(GpuOffload, BatchedRequestsOverASplit) {
  NF4FLASH_REQUIRE_CUDA();
  auto split = Engine::load(options("llama3-hd128-ropescaled", QuantChoice::NF4, 1));
  ASSERT_EQ(split->report().offload_device, "cpu");
  const int64_t V = split->vocab_size();
  std::map<int64_t, std::vector<int32_t>> want;
  std::vector<BatchRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    BatchRequest r;
    r.id = i;
    for (int t = 0; t < 6 + 5 * i; ++t) r.prompt.push_back(int32_t((11 + 23 * t + 101 * i) % (V - 1) + 1));
    r.gen.max_new_tokens = 6;
    r.gen.ignore_eos = true;
    GenerateOptions g = r.gen;
    g.reuse_cache = false;
    want[i] = split->generate(r.prompt, g).tokens;
    reqs.push_back(r);
  }
  BatchRunnerOptions o;
  o.sched.max_seqs_per_step = 3;
  BatchRunner runner(*split, o);
  for (BatchRequest& r : reqs) ASSERT_EQ(runner.submit(r).status, SubmitResult::Status::Accepted);
  std::map<int64_t, std::vector<int32_t>> got;
  for (int steps = 0; runner.has_work() && steps < 300; ++steps)
    for (const BatchOutput& out : runner.step()) got[out.id] = out.tokens;
  EXPECT_EQ(got, want);
}

TEST(GpuOffload, MaxVramBelowOneLayerIsAnError) {
  NF4FLASH_REQUIRE_CUDA();
  LoadOptions o = options("llama-gqa-hd64", QuantChoice::None, kAutoLayers);
  o.max_vram = size_t(1) << 20;
  try {
    Engine::load(o);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is below what one layer on the GPU needs"), std::string::npos) << e.what();
  }
}
