// The whole model on the GPU against the transformers goldens, through prefill (score) and
// decode (greedy generate, KV cache, CUDA graphs): bf16 and the 4-bit variants (quantized on
// load and pre-quantized) must land no further from the goldens than twice transformers' own
// bf16-vs-f32 distance (log-probs pooled over the three sequences, logits per sequence); f32
// compute within 1e-3 of the f32 golden (tf32 off).
#include <gtest/gtest.h>

#include "backend/cuda_tuning.h"
#include "cuda_test_util.h"
#include "quant/blockwise.h"
#include "nf4flash/engine.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

struct GpuCase {
  const char* model;
  const char* variant;  // golden variant: bf16 | nf4 | fp4 | f32
  const char* folder_suffix;  // "" or "-bnb-nf4" ...
  QuantChoice quant;
  bool dq;
  ComputeDType compute;
};

std::unique_ptr<Engine> load_gpu(const GpuCase& c, AttnChoice attn = AttnChoice::Auto, bool graphs = true) {
  LoadOptions o;
  o.model_dir = model_dir(std::string(c.model) + c.folder_suffix);
  o.device = DeviceChoice::CUDA;
  o.compute = c.compute;
  o.quant = c.quant;
  o.double_quant = c.dq;
  o.attn = attn;
  o.graphs = graphs;
  o.ctx_size = 512;
  o.load_tokenizer = false;
  return Engine::load(o);
}

class GpuModel : public ::testing::TestWithParam<GpuCase> {};

void expect_score_matches_goldens(const GpuCase& c, AttnChoice attn = AttnChoice::Auto) {
  Golden g(c.model);
  auto e = load_gpu(c, attn);
  const bool f32 = std::string(c.variant) == "f32";
  std::vector<float> lp, lp_ref, lp16, lp32;
  auto app = [](std::vector<float>& d, const std::vector<float>& s) { d.insert(d.end(), s.begin(), s.end()); };
  for (int i = 0; i < 3; ++i) {
    const ScoreResult r = e->score(g.i32(cat("tokens_", i)), false, true);
    app(lp, r.next_token_logprobs);
    app(lp_ref, g.f32(cat("nextlogprob_", c.variant, "_", i)));
    app(lp16, g.f32(cat("nextlogprob_bf16_", i)));
    app(lp32, g.f32(cat("nextlogprob_f32_", i)));
    const auto rows = flatten(r.logits, i == 0 ? 0 : r.logits.size() - 4);
    const double tol = f32 ? 1e-3 : 2 * rel_l2(g.f32(cat("logits_bf16_", i)), g.f32(cat("logits_f32_", i)));
    EXPECT_LE(rel_l2(rows, g.f32(cat("logits_", c.variant, "_", i))), tol) << c.model << " " << c.variant << " seq " << i;
  }
  const double tol = f32 ? 1e-3 : 2 * rel_l2(lp16, lp32);
  EXPECT_LE(rel_l2(lp, lp_ref), tol) << c.model << " " << c.variant << " log-probs";
}

TEST_P(GpuModel, ScoreMatchesGoldens) {
  NF4FLASH_REQUIRE_CUDA();
  expect_score_matches_goldens(GetParam());
}

void expect_decode_matches_prefill(const GpuCase& c) {
  Golden g(c.model);
  auto e = load_gpu(c);
  const auto toks = g.i32("tokens_1");
  const ScoreResult full = e->score(toks, false, true);
  auto& im = e->internals();
  const int64_t V = e->vocab_size(), k = 9;
  std::vector<float> row(V);
  im.forward_tokens(toks.data(), k, 0, false, [](int64_t, Act) {});
  double worst = 0;
  for (int64_t p = k; p < static_cast<int64_t>(toks.size()); ++p) {
    im.decode_step(toks[p], p);
    im.be->download(row.data(), im.logits_act(1).data, V * 4);
    worst = std::max(worst, rel_l2(row, full.logits[p]));
  }
  // decode (GEMV, flash-decoding) and prefill (GEMM, tiled attention) round differently in bf16
  EXPECT_LT(worst, std::string(c.variant) == "f32" ? 1e-4 : 2e-2) << c.model << " " << c.variant;
}

TEST_P(GpuModel, DecodeStepMatchesPrefillLogits) {
  NF4FLASH_REQUIRE_CUDA();
  expect_decode_matches_prefill(GetParam());
}

const GpuCase kGpuCases[] = {
    {"llama-gqa-hd64", "f32", "", QuantChoice::Auto, false, ComputeDType::F32},
    {"llama-gqa-hd64", "bf16", "", QuantChoice::Auto, false, ComputeDType::BF16},
    {"llama-gqa-hd64", "nf4", "", QuantChoice::NF4, true, ComputeDType::BF16},
    {"llama-gqa-hd64", "nf4", "-bnb-nf4", QuantChoice::Auto, false, ComputeDType::BF16},
    {"llama-gqa-hd64", "fp4", "-bnb-fp4", QuantChoice::Auto, false, ComputeDType::BF16},
    {"llama3-hd128-ropescaled", "bf16", "", QuantChoice::Auto, false, ComputeDType::BF16},
    {"llama3-hd128-ropescaled", "nf4", "-bnb-nf4", QuantChoice::Auto, false, ComputeDType::BF16},
    {"llama3-hd128-ropescaled", "fp4", "", QuantChoice::FP4, false, ComputeDType::BF16},
    {"qwen2-bias", "bf16", "", QuantChoice::Auto, false, ComputeDType::BF16},
    {"qwen2-bias", "nf4", "-bnb-nf4", QuantChoice::Auto, false, ComputeDType::BF16},
    {"qwen2-bias", "fp4", "-bnb-fp4", QuantChoice::Auto, false, ComputeDType::BF16},
    {"llama2-tok-hd64", "bf16", "", QuantChoice::Auto, false, ComputeDType::BF16},
    {"llama2-tok-hd64", "nf4", "", QuantChoice::NF4, true, ComputeDType::BF16},
};

INSTANTIATE_TEST_SUITE_P(Models, GpuModel, ::testing::ValuesIn(kGpuCases), [](const auto& info) {
  std::string s = cat(info.param.model, info.param.folder_suffix, "_", info.param.variant);
  for (auto& ch : s)
    if (ch == '-' || ch == '.') ch = '_';
  return s;
});

// The paths of GPUs other than Hopper, selected on this one through CudaTuning (the engine creates
// its backend under ScopedCudaTuning): the mma.sync flash kernel, dequantize + cuBLAS for the 4-bit
// prompt products, no programmatic dependent launch. The decode GEMVs, decode attention and
// sampling are the same kernels on every GPU. The whole model against the goldens.
TEST(GpuModelPortable, NonHopperPathsMatchGoldens) {
  NF4FLASH_REQUIRE_CUDA();
  const ScopedCudaTuning portable(tuning_with([](CudaTuning& t) {
    t.flash_kernel = FlashKernelChoice::Mma;
    t.q4_gemm = Q4GemmMode::Dequant;
    t.pdl = false;
  }));
  const GpuCase cases[] = {{"llama-gqa-hd64", "bf16", "", QuantChoice::Auto, false, ComputeDType::BF16},
                           {"llama-gqa-hd64", "nf4", "", QuantChoice::NF4, true, ComputeDType::BF16},
                           {"llama3-hd128-ropescaled", "nf4", "-bnb-nf4", QuantChoice::Auto, false, ComputeDType::BF16},
                           {"qwen2-bias", "fp4", "-bnb-fp4", QuantChoice::Auto, false, ComputeDType::BF16}};
  for (const GpuCase& c : cases) {
    SCOPED_TRACE(cat(c.model, c.folder_suffix, " ", c.variant));
    expect_score_matches_goldens(c);
    // the engine's backend took the portable paths
    auto e = load_gpu(c);
    Backend& be = *e->internals().be;
    EXPECT_NE(be.attn_path(AttnImpl::Flash).find("mma.sync"), std::string::npos) << be.attn_path(AttnImpl::Flash);
    auto W = randn(64 * 128, 0.05f);
    auto w = be.upload_quant4(
        std::make_shared<Quant4Tensor>(quantize_4bit(W.data(), DType::F32, 64, 128, QuantType::NF4, 64, true)));
    EXPECT_NE(be.linear_path(*w, 100).find("cublasGemmEx"), std::string::npos) << be.linear_path(*w, 100);
  }
}

TEST(GpuModelGreedy, GreedyWithGraphsEqualsWithoutAndMatchesGoldenPrefix) {
  NF4FLASH_REQUIRE_CUDA();
  Golden g("llama-gqa-hd64");
  const GpuCase c{"llama-gqa-hd64", "f32", "", QuantChoice::Auto, false, ComputeDType::F32};
  GenerateOptions go;
  go.max_new_tokens = 24;
  go.ignore_eos = true;
  auto with = load_gpu(c, AttnChoice::Auto, true);
  auto without = load_gpu(c, AttnChoice::Auto, false);
  const auto a = with->generate(g.i32("tokens_1"), go), b = without->generate(g.i32("tokens_1"), go);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.tokens, g.i32("greedy_f32_from_1"));
}

// The pipelined decode loop (the CUDA default: each step queued before the host has the token it
// consumes) against the synchronous one: the same tokens for greedy (graphs on and off, 4-bit and
// bf16), a stop on a token mid-way, seeded sampling with and without the repetition penalty, and
// the cache reused after that stop.
TEST(GpuModelGreedy, PipelinedDecodeEqualsSynchronous) {
  NF4FLASH_REQUIRE_CUDA();
  const GpuCase cases[] = {{"llama-gqa-hd64", "nf4", "", QuantChoice::NF4, true, ComputeDType::BF16},
                           {"llama3-hd128-ropescaled", "bf16", "", QuantChoice::Auto, false, ComputeDType::BF16}};
  for (const GpuCase& c : cases) {
    const auto prompt = Golden(c.model).i32("tokens_1");
    for (bool graphs : {true, false}) {
      auto e = load_gpu(c, AttnChoice::Auto, graphs);
      auto& im = e->internals();
      ASSERT_TRUE(im.pipeline) << "pipelined decode is the CUDA default";
      auto run = [&](bool pipe, const GenerateOptions& go) {
        im.pipeline = pipe;
        return e->generate(prompt, go);
      };
      const std::string what = cat(c.model, " ", c.variant, graphs ? " graphs" : " no graphs");
      GenerateOptions go;
      go.max_new_tokens = 20;
      go.ignore_eos = true;
      go.reuse_cache = false;
      const GenerateResult a = run(false, go), b = run(true, go);
      EXPECT_EQ(a.tokens, b.tokens) << what;
      EXPECT_EQ(b.timing.decode_tokens, 19) << what;
      GenerateOptions gs = go;
      gs.ignore_eos = false;
      gs.stop_ids = {a.tokens[7]};
      const GenerateResult as = run(false, gs), bs = run(true, gs);
      EXPECT_EQ(as.tokens, bs.tokens) << what << " stop";
      EXPECT_EQ(bs.stop_reason, "eos") << what;
      GenerateOptions gr = go;  // temperature sampling, seeded: the same uniforms in the same order
      gr.sampling.temperature = 1.2f;
      gr.sampling.top_p = 0.9f;
      gr.sampling.seed = 99;
      EXPECT_EQ(run(false, gr).tokens, run(true, gr).tokens) << what << " sampled";
      GenerateOptions gp = gr;  // the penalty's history on the device
      gp.sampling.repeat_penalty = 1.4f;
      EXPECT_EQ(run(false, gp).tokens, run(true, gp).tokens) << what << " penalty";
      // a second turn after a pipelined stop: the cache it claims is exact
      im.pipeline = true;
      const GenerateResult t1 = e->generate(prompt, gs);
      std::vector<int32_t> turn2 = prompt;
      turn2.insert(turn2.end(), t1.tokens.begin(), t1.tokens.end());
      turn2.push_back(5);
      GenerateOptions g2 = go;
      g2.reuse_cache = true;
      g2.max_new_tokens = 8;
      const GenerateResult reused = e->generate(turn2, g2);
      EXPECT_GE(reused.timing.cached_tokens, static_cast<int64_t>(prompt.size())) << what;
      g2.reuse_cache = false;
      EXPECT_EQ(reused.tokens, e->generate(turn2, g2).tokens) << what << " turn 2";
      EXPECT_GT(e->bench_decode(16, 40), 0.0) << what;
    }
  }
}

// The same model loaded on the GPU (bf16 compute) and on the CPU (`cpu_compute`) with options `o`:
// the three golden sequences' logits within the bf16 tolerance of each other (twice transformers'
// own bf16-vs-f32 distance).
void expect_gpu_close_to_cpu(LoadOptions o, ComputeDType cpu_compute, const std::string& golden) {
  Golden g(golden);
  o.ctx_size = 512;
  o.load_tokenizer = false;
  o.compute = ComputeDType::BF16;
  o.device = DeviceChoice::CUDA;
  auto gpu = Engine::load(o);
  o.device = DeviceChoice::CPU;
  o.compute = cpu_compute;
  auto cpu = Engine::load(o);
  for (int i = 0; i < 3; ++i) {
    const auto toks = g.i32(cat("tokens_", i));
    const ScoreResult a = gpu->score(toks, false, true), b = cpu->score(toks, false, true);
    const double tol = 2 * rel_l2(g.f32(cat("logits_bf16_", i)), g.f32(cat("logits_f32_", i)));
    EXPECT_LE(rel_l2(flatten(a.logits), flatten(b.logits)), tol) << golden << " seq " << i;
  }
}

}  // namespace

// --quant-lm-head on a model with tied embeddings: the 4-bit copy of the table is the output
// projection on the GPU as on the CPU (the dense table stays for the lookups, in host memory on
// CUDA). Both land as close to the CPU's logits as the 4-bit layers' own bf16 tolerance.
TEST(GpuModelGreedy, QuantLmHeadOnTiedEmbeddingsMatchesCpu) {
  NF4FLASH_REQUIRE_CUDA();
  LoadOptions o;
  o.model_dir = model_dir("llama3-hd128-ropescaled");
  o.quant = QuantChoice::NF4;
  o.double_quant = true;
  o.quant_lm_head = true;
  expect_gpu_close_to_cpu(o, ComputeDType::BF16, "llama3-hd128-ropescaled");
}

// Mixtures of experts and dynamic NTK RoPE run on the CPU backend only so far: loading them on
// CUDA is one clear error.
TEST(GpuModelGreedy, CpuOnlyFamiliesOnCudaAreAClearError) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : {"mixtral-moe", "qwen2moe-shared", "qwen3moe-topk", "llama-rope-dynamic"}) {
    LoadOptions o;
    o.model_dir = model_dir(model);
    o.device = DeviceChoice::CUDA;
    o.ctx_size = 512;
    o.load_tokenizer = false;
    try {
      Engine::load(o);
      ADD_FAILURE() << model << ": no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("CPU backend only"), std::string::npos) << model << ": " << m;
    }
  }
}

// The families beyond Llama/Qwen2 on CUDA against their transformers goldens: Gemma 2 (head_dim
// 256, soft-capping, sliding window on every other layer, GeGLU, sandwich norms), Gemma 3 (q/k
// norms, local RoPE on its sliding layers), Phi-3 (head_dim 96, fused projections, LongRoPE past
// its original context), YaRN, and head_dim 32 and 80: f32 compute with sdpa and eager (within
// 1e-3), bf16 with flash, sdpa and eager (within twice transformers' own bf16-vs-f32 distance);
// decode steps against the prefill's logits; NF4 (double quant) and FP4 against their goldens
// (scripts/make-quant-goldens.py), and NF4 on the GPU against the CPU's.
const char* const kFamilyModels[] = {"gemma2-hd256-softcap", "gemma3-qknorm-window", "phi3-longrope-hd96",
                                     "llama-rope-yarn", "mistral-hd32", "llama-hd80"};

TEST(GpuFamilies, ScoreMatchesGoldensWithEveryAttention) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kFamilyModels) {
    for (ComputeDType cd : {ComputeDType::F32, ComputeDType::BF16}) {
      for (AttnChoice a : {AttnChoice::Flash, AttnChoice::Sdpa, AttnChoice::Eager}) {
        if (cd == ComputeDType::F32 && a == AttnChoice::Flash) continue;  // flash needs bf16/f16
        const GpuCase c{model, cd == ComputeDType::F32 ? "f32" : "bf16", "", QuantChoice::Auto, false, cd};
        SCOPED_TRACE(cat(model, " ", c.variant, " attn ", int(a)));
        expect_score_matches_goldens(c, a);
      }
    }
  }
}

TEST(GpuFamilies, DecodeStepMatchesPrefillLogits) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kFamilyModels) {
    expect_decode_matches_prefill({model, "f32", "", QuantChoice::Auto, false, ComputeDType::F32});
    expect_decode_matches_prefill({model, "bf16", "", QuantChoice::Auto, false, ComputeDType::BF16});
  }
}

TEST(GpuFamilies, Nf4Fp4MatchGoldens) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kFamilyModels) {
    expect_score_matches_goldens({model, "nf4", "", QuantChoice::NF4, true, ComputeDType::BF16});
    expect_score_matches_goldens({model, "fp4", "", QuantChoice::FP4, false, ComputeDType::BF16});
  }
}

TEST(GpuFamilies, Nf4MatchesCpu) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kFamilyModels) {
    LoadOptions o;
    o.model_dir = model_dir(model);
    o.quant = QuantChoice::NF4;
    o.double_quant = true;
    expect_gpu_close_to_cpu(o, ComputeDType::F32, model);
  }
}
