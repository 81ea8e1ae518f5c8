// nf4flash-kernel-bench: a Qwen3-30B-A3B mixture-of-experts layer's experts (128 experts of
// 2048 -> 768 -> 2048, top 8, NF4 double quant) through Backend::moe_experts: routing, gate + up +
// SiLU and down of the selected experts over the rows grouped by expert, and the weighted sum, at
// T = 1, 4, 16 rows. Each timed call routes with the next of 16 router-logit buffers, buffer i
// choosing experts 8i .. 8i+7 for every row, so that replays cycle through all 128 experts (302 MB,
// far past the L2) as a decode step's routing does. Bytes: the selected experts' resident bytes
// (T=1: 8 experts; more rows pick the same 8 here) plus the activations.
#include <vector>

#include "bench.h"
#include "core/error.h"

namespace nf4flash::kbench {

void moe_experts(Context& c) {
  constexpr int E = 128, K = 8, kRoutings = E / K;
  constexpr int64_t H = 2048, I = 768;
  Backend& be = c.be;
  c.report.section("moe", cat("MoE experts (Qwen3-30B-A3B: ", E, " experts ", H, "->", I, "->", H,
                              ", top ", K, ", nf4-dq)"));
  const auto gate = random_q4(I, H, true, c.rng), up = random_q4(I, H, true, c.rng), down = random_q4(H, I, true, c.rng);
  std::vector<std::unique_ptr<Weight>> ws;
  std::vector<Backend::ExpertRefs> refs;
  for (int e = 0; e < E; ++e) {
    ws.push_back(be.upload_quant4(gate));
    ws.push_back(be.upload_quant4(up));
    ws.push_back(be.upload_quant4(down));
    refs.push_back({ws[ws.size() - 3].get(), ws[ws.size() - 2].get(), ws.back().get()});
  }
  auto set = be.make_expert_set(refs);
  NF4FLASH_CHECK(set, "moe_experts: the backend made no expert set");
  const double expert_bytes = double(ws[0]->resident_bytes() + ws[1]->resident_bytes() + ws[2]->resident_bytes());
  for (int T : {1, 4, 16}) {
    std::vector<std::unique_ptr<Buffer>> logits;
    for (int r = 0; r < kRoutings; ++r) {
      std::vector<float> l(size_t(T) * E, 0.f);
      for (int t = 0; t < T; ++t)
        for (int k = 0; k < K; ++k) l[size_t(t) * E + size_t(r * K + k)] = 4.f + float(k);
      logits.push_back(be.alloc(l.size() * 4));
      be.upload(logits.back()->data(), l.data(), l.size() * 4);
    }
    auto x = randn_bf16(be, size_t(T * H), c.rng);
    auto out = be.alloc(size_t(T * H) * 2);
    auto scratch = be.alloc(be.moe_scratch_bytes(*set, T, K));
    const Act xa = x->as_act(DType::BF16, T, H), oa = out->as_act(DType::BF16, T, H);
    const double sec = time_graph(
        be,
        [&](int i) {
          const Act la = logits[size_t(i) % logits.size()]->as_act(DType::F32, T, E);
          be.moe_experts(xa, la, *set, K, true, Act{}, Act{}, scratch->data(), oa);
        },
        c.reps, c.trials);
    c.report.row(cat("moe nf4-dq top", K, " of ", E, " T=", T), sec, K * expert_bytes + 4.0 * T * H + 4.0 * T * E, 0,
                 {{"T", T}, {"experts", E}, {"top_k", K}, {"hidden", H}, {"expert_intermediate", I}});
  }
}

}  // namespace nf4flash::kbench
