// Mixtures of experts on CUDA (routing, the experts' products over rows grouped by expert and the
// weighted sum on the GPU: Backend::moe_experts):
//  - the op against the CPU's host routing (MoeBlock on the CPU backend) on the same weights and the
//    same router logits: 128 experts, top 8, 16 experts of wider shapes, 160 / 300 experts and the
//    conformance models' 4 experts, top 2, 1, 5 and 40 rows
//    (groups of 1..8 rows per expert), 4-bit (NF4 double quant, FP4) and dense experts, f32 and
//    bf16 compute, top-k weights renormalized or not, the sum added to a residual (equal to add());
//    router logits tied exactly (the lower expert wins);
//  - Mixtral, Qwen2-MoE (shared expert with its gate) and Qwen3-MoE against their transformers
//    goldens (f32 with sdpa and eager, bf16 with flash, sdpa and eager), decode steps against the prefill's logits, NF4/FP4 on the GPU against
//    the CPU (f32 compute), and greedy decoding with the step captured in a CUDA graph equal to without and to
//    transformers' greedy ids.
#include <gtest/gtest.h>

#include <algorithm>

#include "cuda_test_util.h"
#include "model/moe.h"
#include "model_checks_gpu.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

const char* const kMoeModels[] = {"mixtral-moe", "qwen2moe-shared", "qwen3moe-topk"};

enum class ExpertKind { Nf4Dq, Fp4, Dense };

// The experts of one layer on both backends: CPU (host routing) and CUDA (its expert set).
struct Experts {
  MoeWeights cpu, gpu;
};

// period > 0: router row e is row e % period (logits tie exactly in groups of experts).
Experts make_experts(Backends& b, DType compute, ExpertKind kind, int E, int64_t H, int64_t I, int period = 0) {
  Experts x;
  auto R = randn(size_t(E * H), 0.5f);
  if (period > 0)
    for (int e = period; e < E; ++e) std::copy_n(R.begin() + (e % period) * H, H, R.begin() + e * H);
  x.cpu.router = b.cpu->upload_dense(f32_tensor(R, {E, H}), DType::F32);
  x.gpu.router = b.gpu->upload_dense(f32_tensor(R, {E, H}), compute);
  auto one = [&](int64_t rows, int64_t cols, std::unique_ptr<Weight>& c, std::unique_ptr<Weight>& g) {
    if (kind == ExpertKind::Dense) {
      const auto W = rounded(randn(size_t(rows * cols), 0.05f), compute);
      c = b.cpu->upload_dense(f32_tensor(W, {rows, cols}), DType::F32);
      g = b.gpu->upload_dense(f32_tensor(W, {rows, cols}), compute);
    } else {
      auto q = random_quant4(rows, cols, kind == ExpertKind::Fp4 ? QuantType::FP4 : QuantType::NF4,
                             kind == ExpertKind::Nf4Dq);
      c = b.cpu->upload_quant4(q);
      g = b.gpu->upload_quant4(q);
    }
  };
  std::vector<Backend::ExpertRefs> refs;
  for (int e = 0; e < E; ++e) {
    ExpertWeights c, g;
    one(I, H, c.gate, g.gate);
    one(I, H, c.up, g.up);
    one(H, I, c.down, g.down);
    x.cpu.experts.push_back(std::move(c));
    x.gpu.experts.push_back(std::move(g));
  }
  for (const ExpertWeights& g : x.gpu.experts) refs.push_back({g.gate.get(), g.up.get(), g.down.get()});
  x.gpu.set = b.gpu->make_expert_set(refs);
  return x;
}

struct MoeShape {
  int E, K;
  int64_t H, I;
};

void expect_experts_match(const MoeShape& sh, DType compute, ExpertKind kind, int period = 0) {
  const int E = sh.E, K = sh.K;
  const int64_t H = sh.H, I = sh.I;
  Backends b(compute);
  Experts x = make_experts(b, compute, kind, E, H, I, period);
  ASSERT_TRUE(x.gpu.set) << "the CUDA backend bundles the experts";
  for (bool norm : {true, false}) {
    const ModelConfig cfg = moe_test_config(H, E, K, I, norm);
    MoeBlock ref(*b.cpu, cfg);
    for (int64_t T : {1, 5, 40}) {
      SCOPED_TRACE(cat(E, " experts ", H, "x", I, " ", dtype_name(compute), " kind ", int(kind), " norm ", norm, " T ", T,
                       " period ", period));
      const auto xv = rounded(randn(size_t(T * H)), compute);
      DevAct xc(*b.cpu, T, H), oc(*b.cpu, T, H), lc(*b.cpu, T, E, DType::F32);
      xc.set(xv);
      ref.forward(xc.act, x.cpu, oc.act);
      // the GPU routes the CPU's logits: the same experts for every row
      b.cpu->linear(xc.act, *x.cpu.router, nullptr, lc.act);
      DevAct xg(*b.gpu, T, H), og(*b.gpu, T, H), lg(*b.gpu, T, E, DType::F32);
      xg.set(xv);
      lg.set(lc.get());
      og.poison();
      auto scratch = b.gpu->alloc(b.gpu->moe_scratch_bytes(*x.gpu.set, T, K));
      b.gpu->moe_experts(xg.act, lg.act, *x.gpu.set, K, norm, Act{}, Act{}, scratch->data(), og.act);
      EXPECT_LT(rel_err(og.get(), oc.get()), compute == DType::F32 ? 1e-5 : 1e-2);
      // residual: out + the sum, bit for bit as add() adds the sum to out
      const auto r0 = rounded(randn(size_t(T * H)), compute);
      DevAct res(*b.gpu, T, H), sum(*b.gpu, T, H);
      res.set(r0);
      sum.set(r0);
      b.gpu->moe_experts(xg.act, lg.act, *x.gpu.set, K, norm, Act{}, Act{}, scratch->data(), res.act, true);
      b.gpu->add(sum.act, og.act, sum.act);
      EXPECT_EQ(res.get(), sum.get());
    }
  }
}

// 128 experts of 256 -> 128 (every lane of the routing warp holds 4 experts; one warp a unit),
// 16 experts of 1024 -> 768 (one expert a lane; a decode step's units on 4 and 2 warps), and 160
// and 300 experts (8 and 16 a lane, the last lanes' slots partly past E).
TEST(MoeGpu, ExpertsMatchHostRouting) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType compute : {DType::F32, DType::BF16})
    for (ExpertKind kind : {ExpertKind::Nf4Dq, ExpertKind::Fp4, ExpertKind::Dense})
      expect_experts_match({128, 8, 256, 128}, compute, kind);
  expect_experts_match({16, 4, 1024, 768}, DType::BF16, ExpertKind::Nf4Dq);
  for (int E : {160, 300}) expect_experts_match({E, 8, 128, 64}, DType::BF16, ExpertKind::Nf4Dq);
  // the conformance models' shapes: 4 experts, top 2, hidden 128, expert rows 128 (Mixtral) and 64
  for (int64_t I : {128, 64}) expect_experts_match({4, 2, 128, I}, DType::BF16, ExpertKind::Nf4Dq);
}

// Exact ties between router logits: every expert alike (period 1: experts 0..7 win), and groups
// of 3 alike (period 43: the top 8 cut a group of 3, the lower experts of it win), as on the CPU.
TEST(MoeGpu, TiedRouterLogitsPickTheLowerExperts) {
  NF4FLASH_REQUIRE_CUDA();
  for (int period : {1, 43})
    for (DType compute : {DType::F32, DType::BF16}) expect_experts_match({128, 8, 256, 128}, compute, ExpertKind::Nf4Dq, period);
}

TEST(MoeGpu, ScoreMatchesGoldens) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kMoeModels) {
    for (ComputeDType cd : {ComputeDType::F32, ComputeDType::BF16}) {
      for (AttnChoice a : {AttnChoice::Flash, AttnChoice::Sdpa, AttnChoice::Eager}) {
        if (cd == ComputeDType::F32 && a == AttnChoice::Flash) continue;  // flash needs bf16/f16
        SCOPED_TRACE(cat(model, " attn ", int(a)));
        expect_score_matches_goldens({model, cd == ComputeDType::F32 ? "f32" : "bf16", "", QuantChoice::Auto, false, cd},
                                     a);
      }
    }
  }
}

// NF4 double quant at bf16: where the 4-bit weights take the decode GEMV, the decode step runs the
// fused layer order (norms folded into the GEMVs, the experts' sum added to x by moe_experts). Its
// steps run positions 9..17: with NF4 weights (f32 on the CPU) Mixtral's layer 0 routes position 18
// on a 0.0013 gap between its 2nd and 3rd experts' probabilities (0.2489 / 0.2476), which bf16's
// rounding of the step's input can flip (the prefill's GEMM and the step's GEMV round differently),
// and the flipped row's keys and values then carry into every later position.
TEST(MoeGpu, DecodeStepMatchesPrefillLogits) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kMoeModels) {
    expect_decode_matches_prefill({model, "f32", "", QuantChoice::Auto, false, ComputeDType::F32});
    expect_decode_matches_prefill({model, "bf16", "", QuantChoice::Auto, false, ComputeDType::BF16});
    expect_decode_matches_prefill({model, "bf16", "", QuantChoice::NF4, true, ComputeDType::BF16}, 18);
  }
}

// NF4 (double quant) and FP4 experts quantized on load: the model on the GPU with f32 compute
// against the CPU's f32 logits within 1e-3 (both route every token alike). With bf16 compute a
// token whose top-k experts are nearly tied can route differently from f32 (transformers' bf16 does
// too); the bf16 4-bit kernels are checked under one routing by ExpertsMatchHostRouting.
TEST(MoeGpu, FourBitMatchesCpu) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kMoeModels) {
    for (QuantChoice q : {QuantChoice::NF4, QuantChoice::FP4}) {
      SCOPED_TRACE(cat(model, " quant ", int(q)));
      LoadOptions o;
      o.model_dir = model_dir(model);
      o.quant = q;
      o.double_quant = q == QuantChoice::NF4;
      expect_gpu_close_to_cpu(o, ComputeDType::F32, model, ComputeDType::F32, 1e-3);
    }
  }
}

TEST(MoeGpu, GreedyWithGraphsEqualsWithoutAndMatchesGoldens) {
  NF4FLASH_REQUIRE_CUDA();
  for (const char* model : kMoeModels) {
    Golden g(model);
    const auto want = g.i32("greedy_f32_from_1");
    const GpuCase c{model, "f32", "", QuantChoice::Auto, false, ComputeDType::F32};
    GenerateOptions go;
    go.max_new_tokens = static_cast<int>(want.size());
    go.ignore_eos = true;
    auto with = load_gpu(c, AttnChoice::Auto, true);
    auto without = load_gpu(c, AttnChoice::Auto, false);
    const auto a = with->generate(g.i32("tokens_1"), go), b = without->generate(g.i32("tokens_1"), go);
    EXPECT_EQ(a.tokens, b.tokens) << model;
    EXPECT_EQ(a.tokens, want) << model;
  }
}

}  // namespace
