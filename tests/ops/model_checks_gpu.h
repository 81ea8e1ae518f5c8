// Whole-model checks of the GPU tests: a model loaded on CUDA scored against its transformers
// goldens (f32 within 1e-3; otherwise within twice transformers' own bf16-vs-f32 distance), decode
// steps against the prefill's logits, and the GPU against the CPU on the same weights.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "nf4flash/engine.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

namespace nf4flash::test {

struct GpuCase {
  const char* model;
  const char* variant;  // golden variant: bf16 | nf4 | fp4 | f32
  const char* folder_suffix;  // "" or "-bnb-nf4" ...
  QuantChoice quant;
  bool dq;
  ComputeDType compute;
};

inline std::unique_ptr<Engine> load_gpu(const GpuCase& c, AttnChoice attn = AttnChoice::Auto, bool graphs = true) {
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

inline void expect_score_matches_goldens(const GpuCase& c, AttnChoice attn = AttnChoice::Auto) {
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

// Decode steps from position 9 to `end` (0: the sequence's end) against the prefill's logits.
inline void expect_decode_matches_prefill(const GpuCase& c, int64_t end = 0) {
  Golden g(c.model);
  auto e = load_gpu(c);
  const auto toks = g.i32("tokens_1");
  const ScoreResult full = e->score(toks, false, true);
  auto& im = e->internals();
  const int64_t V = e->vocab_size(), k = 9;
  std::vector<float> row(V);
  im.forward_tokens(toks.data(), k, 0, false, [](int64_t, Act) {});
  double worst = 0;
  std::string steps;  // each step's error, for the failure message
  const int64_t n = end > 0 ? std::min<int64_t>(end, toks.size()) : static_cast<int64_t>(toks.size());
  for (int64_t p = k; p < n; ++p) {
    im.decode_step(toks[p], p);
    im.be->download(row.data(), im.logits_act(1).data, V * 4);
    const double err = rel_l2(row, full.logits[p]);
    worst = std::max(worst, err);
    steps += cat(" ", p, ":", err);
  }
  // decode (GEMV, flash-decoding) and prefill (GEMM, tiled attention) round differently in bf16
  EXPECT_LT(worst, std::string(c.variant) == "f32" ? 1e-4 : 2e-2)
      << c.model << " " << c.variant << (c.quant == QuantChoice::NF4 ? " nf4" : "") << (c.dq ? " dq" : "")
      << "; rel. error at each position:" << steps;
}

// The same model loaded on the GPU (`gpu_compute`) and on the CPU (`cpu_compute`) with options `o`:
// the three golden sequences' logits within `tol` of each other, by default the bf16 tolerance
// (twice transformers' own bf16-vs-f32 distance).
inline void expect_gpu_close_to_cpu(LoadOptions o, ComputeDType cpu_compute, const std::string& golden,
                                    ComputeDType gpu_compute = ComputeDType::BF16, double tol = 0) {
  Golden g(golden);
  o.ctx_size = 512;
  o.load_tokenizer = false;
  o.compute = gpu_compute;
  o.device = DeviceChoice::CUDA;
  auto gpu = Engine::load(o);
  o.device = DeviceChoice::CPU;
  o.compute = cpu_compute;
  auto cpu = Engine::load(o);
  for (int i = 0; i < 3; ++i) {
    const auto toks = g.i32(cat("tokens_", i));
    const ScoreResult a = gpu->score(toks, false, true), b = cpu->score(toks, false, true);
    const double t = tol > 0 ? tol : 2 * rel_l2(g.f32(cat("logits_bf16_", i)), g.f32(cat("logits_f32_", i)));
    EXPECT_LE(rel_l2(flatten(a.logits), flatten(b.logits)), t) << golden << " seq " << i;
  }
}

}  // namespace nf4flash::test
