// Placement (--gpu-layers, --max-vram): size and layer-count parsing, the split a budget holds and
// its errors, the size estimate against what loads, and the engine with its later layers on a
// second backend. Here a CPU backend plays the GPU's part (build_engine's primary factory), so
// the split engine must equal the plain CPU engine bit for bit: greedy ids, log-probs, batched
// requests, at every layer boundary; the report names the split.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "runtime/batch_runner.h"
#include "runtime/engine_impl.h"
#include "runtime/placement.h"
#include "test_util.h"

namespace nf4flash {
namespace {

TEST(Placement, ParsesSizes) {
  EXPECT_EQ(parse_size("--max-vram", "10GiB"), size_t(10) << 30);
  EXPECT_EQ(parse_size("--max-vram", "10G"), size_t(10) << 30);
  EXPECT_EQ(parse_size("--max-vram", "10gb"), size_t(10000000000));
  EXPECT_EQ(parse_size("--max-vram", "512MiB"), size_t(512) << 20);
  EXPECT_EQ(parse_size("--max-vram", "1.5GiB"), size_t(3) << 29);
  EXPECT_EQ(parse_size("--max-vram", "4096"), size_t(4096));
  for (const char* bad : {"", "GiB", "10 GiB", "10XB", "-1G", "1.2.3G", "0"})
    EXPECT_NE(test::error_message([&] { parse_size("--max-vram", bad); }).find("--max-vram"), std::string::npos) << bad;
}

TEST(Placement, ParsesGpuLayers) {
  EXPECT_EQ(parse_gpu_layers("all"), kAllLayers);
  EXPECT_EQ(parse_gpu_layers("auto"), kAutoLayers);
  EXPECT_EQ(parse_gpu_layers("0"), 0);
  EXPECT_EQ(parse_gpu_layers("28"), 28);
  for (const char* bad : {"", "-1", "x", "3.5", "all2"})
    EXPECT_NE(test::error_message([&] { parse_gpu_layers(bad); }).find("--gpu-layers"), std::string::npos) << bad;
}

// 4 layers of 1 MiB and 1 KiB of KV per token; embeddings etc. 2 MiB
ModelBytes four_layers() {
  ModelBytes m;
  m.embed = size_t(1) << 20;
  m.head = size_t(1) << 20;
  m.layer.assign(4, size_t(1) << 20);
  m.layer_params.assign(4, 1 << 19);
  m.kv_token_layer = 1024;
  m.kv_token_layer_host = 2048;
  return m;
}

TEST(Placement, BudgetHoldsTheFirstLayers) {
  const ModelBytes m = four_layers();
  const int64_t ctx = 1024;  // 1 MiB of KV per layer on the GPU, 2 MiB on the host
  const size_t fixed = (size_t(2) << 20) + kGpuReserveBytes, layer = size_t(2) << 20;
  const Placement p = place_layers(m, ctx, kAutoLayers, fixed + 2 * layer + layer / 2, "B");
  EXPECT_EQ(p.gpu_layers, 2);
  EXPECT_TRUE(p.offloaded());
  EXPECT_EQ(p.gpu_weights, size_t(2) << 20);
  EXPECT_EQ(p.gpu_kv, size_t(2) << 20);
  EXPECT_EQ(p.cpu_weights, size_t(2) << 20);
  EXPECT_EQ(p.cpu_kv, size_t(4) << 20);
  EXPECT_EQ(p.gpu_total(), fixed + 2 * layer);
  EXPECT_EQ(place_layers(m, ctx, kAutoLayers, 0, "B").gpu_layers, 4);  // no budget: all
  EXPECT_EQ(place_layers(m, ctx, kAllLayers, fixed + 4 * layer, "B").gpu_layers, 4);
  EXPECT_EQ(place_layers(m, ctx, 1, fixed + 2 * layer, "B").gpu_layers, 1);
  EXPECT_EQ(place_layers(m, ctx, 0, fixed, "B").gpu_layers, 0);
  const std::string all = test::error_message([&] { place_layers(m, ctx, kAllLayers, fixed + 3 * layer, "--max-vram X"); });
  EXPECT_NE(all.find("--max-vram X holds 3 of the 4 layers at ctx 1024, not all 4"), std::string::npos) << all;
  const std::string three = test::error_message([&] { place_layers(m, ctx, 4, fixed + 3 * layer, "B"); });
  EXPECT_NE(three.find("--gpu-layers auto (or 3)"), std::string::npos) << three;
  const std::string none = test::error_message([&] { place_layers(m, ctx, kAutoLayers, fixed + layer - 1, "--max-vram Y"); });
  EXPECT_NE(none.find("--max-vram Y is below what one layer on the GPU needs"), std::string::npos) << none;
  EXPECT_NE(test::error_message([&] { place_layers(m, ctx, 5, 0, "B"); }).find("the model has 4 layers"), std::string::npos);
}

// The estimate the plan uses against the bytes the decoder loads.
TEST(Placement, EstimateMatchesLoadedWeights) {
  for (const char* model : {"llama-gqa-hd64", "qwen2-bias", "gemma2-hd256-softcap", "qwen2moe-shared"}) {
    for (QuantChoice q : {QuantChoice::None, QuantChoice::NF4}) {
      SCOPED_TRACE(std::string(model) + (q == QuantChoice::NF4 ? " nf4" : " none"));
      auto e = test::load_cpu_engine(model, q, 64);
      LoadOptions o;
      o.quant = q;
      o.device = DeviceChoice::CPU;
      const ModelBytes m = model_bytes(e->config(), make_plan(o, e->config()), o);
      const double have = double(e->report().weight_bytes);
      // never under (a plan must not overfill the GPU); over by at most 5% on these tiny models
      EXPECT_GE(double(m.weights()) / have, 0.999) << m.weights() << " vs " << have;
      EXPECT_LE(double(m.weights()) / have, 1.05) << m.weights() << " vs " << have;
    }
  }
}

// A decode token reads all of a dense layer, and of a mixture's layer only its top-k experts.
TEST(Placement, DecodeReadsTheTopKExperts) {
  for (const char* model : {"llama-gqa-hd64", "qwen3moe-topk", "qwen2moe-shared"}) {
    const ModelConfig c = load_model_config(test::model_dir(model));
    for (QuantChoice q : {QuantChoice::None, QuantChoice::NF4}) {
      LoadOptions o;
      o.quant = q;
      o.device = DeviceChoice::CPU;
      const ModelBytes m = model_bytes(c, make_plan(o, c), o);
      ASSERT_EQ(m.layer_read.size(), m.layer.size());
      for (size_t i = 0; i < m.layer.size(); ++i) {
        if (!c.moe.sparse(int(i))) {
          EXPECT_EQ(m.layer_read[i], m.layer[i]) << model;
          continue;
        }
        // the experts not chosen: (E - k) experts of 3 H Ie linear parameters
        const size_t unread = size_t(c.moe.n_experts - c.moe.top_k) * 3 * size_t(c.hidden_size) *
                              size_t(c.moe.expert_intermediate);
        // bf16 (the CPU's default compute), or NF4 codes with an f32 absmax a block of 64
        const double per_param = q == QuantChoice::NF4 ? 0.5 + 4.0 / 64 : 2.0;
        EXPECT_NEAR(double(m.layer[i] - m.layer_read[i]), double(unread) * per_param, double(unread) * 0.01)
            << model << " layer " << i;
      }
    }
  }
}

// A fixture model on the CPU backend, one thread, no tokenizer.
LoadOptions cpu_options(const std::string& model, QuantChoice q, ComputeDType c) {
  LoadOptions o;
  o.model_dir = test::model_dir(model);
  o.device = DeviceChoice::CPU;
  o.quant = q;
  o.compute = c;
  o.ctx_size = 128;
  o.threads = 1;
  o.load_tokenizer = false;
  return o;
}

// The same with a CPU backend playing the GPU's part, its layers from gpu_layers on the offload backend.
std::unique_ptr<Engine> load_split(const std::string& model, QuantChoice q, ComputeDType c, int gpu_layers,
                                   size_t max_vram = 0) {
  LoadOptions o = cpu_options(model, q, c);
  o.gpu_layers = gpu_layers;
  o.max_vram = max_vram;
  const ModelConfig cfg = load_model_config(o.model_dir);
  auto primary = [&](const Plan& p) { return make_cpu_backend({p.compute, 1}); };
  return Engine::from_internals(build_engine(o, cfg, WeightStore::open_dir(o.model_dir), o.model_dir, nullptr, primary));
}

std::unique_ptr<Engine> load_plain(const std::string& model, QuantChoice q, ComputeDType c) {
  return Engine::load(cpu_options(model, q, c));
}

std::vector<int32_t> prompt_for(int64_t V) {
  std::vector<int32_t> p;
  for (int i = 0; i < 11; ++i) p.push_back(int32_t((7 + 31 * i) % (V - 1) + 1));
  return p;
}

void expect_split_equals_plain(const std::string& model, QuantChoice q, ComputeDType c) {
  auto plain = load_plain(model, q, c);
  const int64_t V = plain->vocab_size();
  const std::vector<int32_t> prompt = prompt_for(V);
  GenerateOptions g;
  g.max_new_tokens = 6;
  g.ignore_eos = true;
  const std::vector<int32_t> want = plain->generate(prompt, g).tokens;
  const std::vector<float> want_lp = plain->score(prompt).next_token_logprobs;
  const int n = plain->config().n_layers;
  for (int k = 0; k <= n; ++k) {
    SCOPED_TRACE(model + " gpu_layers " + std::to_string(k));
    auto split = load_split(model, q, c, k);
    const EngineReport& r = split->report();
    EXPECT_EQ(r.n_layers, n);
    EXPECT_EQ(r.gpu_layers, k);
    EXPECT_EQ(r.offload_device, k > 0 && k < n ? "cpu" : "");
    EXPECT_EQ(r.offloaded_bytes > 0, k > 0 && k < n);
    EXPECT_EQ(r.kv_offloaded_bytes > 0, k > 0 && k < n);
    if (k > 0 && k < n) {
      EXPECT_FALSE(r.graphs);
      EXPECT_FALSE(r.decode_pipelined);
    }
    EXPECT_EQ(split->generate(prompt, g).tokens, want);
    EXPECT_EQ(split->score(prompt).next_token_logprobs, want_lp);
  }
}

TEST(EnginePlacement, EverySplitEqualsOneBackendF32) {
  for (const char* model : test::kConformanceModels) expect_split_equals_plain(model, QuantChoice::None, ComputeDType::F32);
}

TEST(EnginePlacement, EverySplitEqualsOneBackendNf4Bf16) {
  for (const char* model : {"llama-gqa-hd64", "qwen2-bias", "gemma3-qknorm-window", "mixtral-moe"})
    expect_split_equals_plain(model, QuantChoice::NF4, ComputeDType::BF16);
}

// FP4, and checkpoints saved pre-quantized by bitsandbytes: their 4-bit tensors load onto
// whichever backend runs the layer.
TEST(EnginePlacement, EverySplitEqualsOneBackendFp4AndPrequantized) {
  expect_split_equals_plain("qwen2-bias", QuantChoice::FP4, ComputeDType::BF16);
  for (const char* model : {"llama-gqa-hd64-bnb-nf4", "llama3-hd128-ropescaled-bnb-fp4"})
    expect_split_equals_plain(model, QuantChoice::Auto, ComputeDType::BF16);
}

// The batched engine over a split: each request's tokens as the plain engine gives them alone.
TEST(EnginePlacement, BatchedRequestsOverASplit) {
  auto plain = load_plain("llama-gqa-hd64", QuantChoice::None, ComputeDType::F32);
  auto split = load_split("llama-gqa-hd64", QuantChoice::None, ComputeDType::F32, 1);
  ASSERT_EQ(split->report().offload_device, "cpu");
  const int64_t V = plain->vocab_size();
  BatchRunnerOptions o;
  o.sched.max_seqs_per_step = 2;
  BatchRunner runner(*split, o);
  std::map<int64_t, std::vector<int32_t>> want;
  for (int i = 0; i < 4; ++i) {
    BatchRequest r;
    r.id = i;
    r.prompt = prompt_for(V);
    r.prompt.resize(size_t(4 + 2 * i));
    r.gen.max_new_tokens = 5;
    r.gen.ignore_eos = true;
    GenerateOptions g = r.gen;
    g.reuse_cache = false;
    want[i] = plain->generate(r.prompt, g).tokens;
    ASSERT_EQ(runner.submit(r).status, SubmitResult::Status::Accepted);
  }
  std::map<int64_t, std::vector<int32_t>> got;
  for (int steps = 0; runner.has_work() && steps < 200; ++steps)
    for (const BatchOutput& out : runner.step()) got[out.id] = out.tokens;
  EXPECT_EQ(got, want);
}

TEST(EnginePlacement, RefusesWhatCannotBePlaced) {
  const std::string tiny = test::error_message([] { load_split("llama-gqa-hd64", QuantChoice::None, ComputeDType::F32, kAutoLayers, 4096); });
  EXPECT_NE(tiny.find("--max-vram 4096 bytes is below what one layer on the GPU needs"), std::string::npos) << tiny;
  const std::string many = test::error_message([] { load_split("llama-gqa-hd64", QuantChoice::None, ComputeDType::F32, 99); });
  EXPECT_NE(many.find("--gpu-layers 99: the model has"), std::string::npos) << many;
  LoadOptions o = cpu_options("llama-gqa-hd64", QuantChoice::Auto, ComputeDType::Auto);
  o.gpu_layers = 1;
  const std::string cpu = test::error_message([&] { Engine::load(o); });
  EXPECT_NE(cpu.find("place layers on a GPU, but the model runs on the CPU backend"), std::string::npos) << cpu;
  o.gpu_layers = 0;  // the whole model on the CPU: what --device cpu runs
  EXPECT_EQ(Engine::load(o)->report().gpu_layers, 0);
}

}  // namespace
}  // namespace nf4flash
