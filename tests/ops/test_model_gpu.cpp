// The whole model on the GPU against the transformers goldens, through prefill (score) and
// decode (greedy generate, KV cache, CUDA graphs): bf16 and the 4-bit variants (quantized on
// load and pre-quantized) must land no further from the goldens than twice transformers' own
// bf16-vs-f32 distance (log-probs pooled over the three sequences, logits per sequence); f32
// compute within 1e-3 of the f32 golden (tf32 off).
#include <gtest/gtest.h>

#include "backend/cuda_tuning.h"
#include "cuda_test_util.h"
#include "model_checks_gpu.h"
#include "quant/blockwise.h"
#include "nf4flash/engine.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

class GpuModel : public ::testing::TestWithParam<GpuCase> {};

TEST_P(GpuModel, ScoreMatchesGoldens) {
  NF4FLASH_REQUIRE_CUDA();
  expect_score_matches_goldens(GetParam());
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

// Dynamic NTK RoPE: each forward's frequencies come from the length it ends at, computed on the GPU
// from the step's positions (so a captured decode step follows the growing length). Greedy ids
// with graphs and without equal transformers' generate (which rotates each new key with the base of
// its own step, as the engine does).
TEST(GpuModelGreedy, DynamicRopeGreedyMatchesGoldens) {
  NF4FLASH_REQUIRE_CUDA();
  Golden g("llama-rope-dynamic");
  const auto want = g.i32("greedy_f32_from_1");
  const GpuCase c{"llama-rope-dynamic", "f32", "", QuantChoice::Auto, false, ComputeDType::F32};
  GenerateOptions go;
  go.max_new_tokens = static_cast<int>(want.size());
  go.ignore_eos = true;
  for (bool graphs : {true, false})
    EXPECT_EQ(load_gpu(c, AttnChoice::Auto, graphs)->generate(g.i32("tokens_1"), go).tokens, want) << graphs;
}

// The families beyond Llama/Qwen2 on CUDA against their transformers goldens: Gemma 2 (head_dim
// 256, soft-capping, sliding window on every other layer, GeGLU, sandwich norms), Gemma 3 (q/k
// norms, local RoPE on its sliding layers), Phi-3 (head_dim 96, fused projections, LongRoPE past
// its original context), YaRN, dynamic NTK, and head_dim 32 and 80: f32 compute with sdpa and
// eager (within 1e-3), bf16 with flash, sdpa and eager (within twice transformers' own bf16-vs-f32
// distance); decode steps against the prefill's logits (not dynamic NTK); NF4 (double quant) and FP4 against their goldens
// (scripts/make-quant-goldens.py), and NF4 on the GPU against the CPU's.
const char* const kFamilyModels[] = {"gemma2-hd256-softcap", "gemma3-qknorm-window", "phi3-longrope-hd96",
                                     "llama-rope-yarn", "llama-rope-dynamic", "mistral-hd32", "llama-hd80"};

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
    // dynamic NTK: a prefill rotates every key with the base of its end, decode steps each key with
    // its own step's (transformers does the same): the two need not agree past the original context
    if (std::string(model) == "llama-rope-dynamic") continue;
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
