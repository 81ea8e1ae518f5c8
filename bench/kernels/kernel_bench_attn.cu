// kernel-bench rows of decode attention (Backend::attention at T = 1: the split kernel + the combine
// launch; and a decode layer's whole attention, rope + cache write + attention), Llama-3-8B layer
// shape: 32 q heads, 8 kv heads, head_dim 128, bf16 cache. Bytes are the K/V read.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernel_bench_util.h"
#include "backend/cuda/launchers.h"

namespace nf4flash::kbench {
namespace {

// "label:ENV=VAL,ENV=VAL" -> label and the settings (an empty list: the defaults)
std::pair<std::string, std::vector<std::pair<std::string, std::string>>> parse_variant(const std::string& v) {
  const size_t colon = v.find(':');
  std::pair<std::string, std::vector<std::pair<std::string, std::string>>> r;
  r.first = v.substr(0, colon);
  if (colon == std::string::npos) return r;
  std::string rest = v.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string kv = rest.substr(0, comma);
    const size_t eq = kv.find('=');
    NF4FLASH_CHECK(eq != std::string::npos && eq > 0, "kernel-bench decode attention variant '", v,
                   "': expected label:ENV=VAL,...");
    r.second.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
  }
  return r;
}

}  // namespace

void bench_decode_attention(Backend& be, const DecodeAttnBench& b, size_t l2_bytes, int reps, int trials,
                            std::mt19937& g, const ReportFn& report) {
  const int nh = 32, nkv = 8, hd = 128;
  for (int ctx : b.ctxs) {
    const int64_t layer_bytes = int64_t(ctx) * nkv * hd * 2 * 2;
    // rotate: enough cache layers that the K/V read comes from HBM, as in a decode step (where a
    // layer's cache was last touched one step, i.e. ~4.5 GB of weights, earlier); else one layer
    // (L2-resident across the repeats when it fits: ctx <= ~8192 on the H200)
    const int layers = b.rotate ? int(std::max<int64_t>(2, int64_t(4 * l2_bytes) / layer_bytes + 1)) : 1;
    // every layer once per replay (else a replay of `reps` launches would cycle through a subset
    // small enough to stay in L2): ctx 512 runs 121 launches a replay
    const int nrep = std::max(reps, layers);
    be.kv_allocate({layers, nkv, hd, ctx, DType::BF16});
    auto qb = be.alloc(size_t(nh * hd) * 2), ob = be.alloc(size_t(nh * hd) * 2), pb = be.alloc(4);
    {  // random K/V for every position (the same rows in every layer) and a random q (never zeros)
      auto kvb = upload_randn_bf16(be, size_t(ctx) * nkv * hd, g);
      auto q = upload_randn_bf16(be, size_t(nh * hd), g);
      CUDA_CHECK(cudaMemcpy(qb->data(), q->data(), size_t(nh * hd) * 2, cudaMemcpyDeviceToDevice));
      const int32_t zero = 0;
      be.upload(pb->data(), &zero, 4);
      Act kva = kvb->as_act(DType::BF16, ctx, nkv * hd);
      for (int l = 0; l < layers; ++l) be.kv_write(l, kva, kva, StepState{static_cast<int32_t*>(pb->data())});
      be.sync();
    }
    const int32_t p0 = ctx - 1;
    be.upload(pb->data(), &p0, 4);
    Act q = qb->as_act(DType::BF16, 1, nh * hd), ov = ob->as_act(DType::BF16, 1, nh * hd);
    StepState st{static_cast<int32_t*>(pb->data())};
    AttnParams ap{nh, nkv, hd, 0.088f, AttnImpl::Auto};
    const std::string where = b.rotate ? cat(", ", layers, " layers") : "";
    for (const std::string& v : b.variants) {
      const auto [label, env] = parse_variant(v);
      for (const auto& [k, val] : env) setenv(k.c_str(), val.c_str(), 1);
      const double sec = time_graph(be, [&](int i) { be.attention(i % layers, q, ov, ap, st); }, nrep, trials);
      nlohmann::json extra = {{"ctx", ctx}, {"n_heads", nh}, {"n_kv_heads", nkv}, {"head_dim", hd},
                              {"variant", label}, {"layers", layers}, {"kv_from", b.rotate ? "hbm" : "one layer"}};
      for (const auto& [k, val] : env) extra["env"][k] = val;
      report(cat("attn decode ctx=", ctx, " ", label, " (32/8, hd128", where, ")"), sec, double(layer_bytes), extra);
      for (const auto& [k, val] : env) unsetenv(k.c_str());
    }
    if (!b.rope_rows) continue;
    // a decode layer's whole attention: rope + cache write + attention (+ combine), fused in one
    // launch (opt-in NF4FLASH_DECODE_FUSED=1, in clusters of 8 splits or plain blocks) or as
    // rope_kv_write + the split kernel + the combine (the default); this step's k and v: random
    auto kn = upload_randn_bf16(be, size_t(nkv * hd), g), inv = upload_rope_freqs(be, hd, 500000.f);
    Act ka = kn->as_act(DType::BF16, 1, nkv * hd);
    RopeParams rp{hd, static_cast<const float*>(inv->data())};
    for (const char* v : {"fused", "fused c1", "unfused"}) {
      const std::string m = v;
      setenv("NF4FLASH_DECODE_FUSED", m == "unfused" ? "0" : "1", 1);
      setenv("NF4FLASH_DECODE_CLUSTER", m == "fused c1" ? "1" : "8", 1);
      const double sec = time_graph(
          be, [&](int i) { be.rope_kv_attention(i % layers, q, ka, ka, ov, rp, ap, st); }, nrep, trials);
      report(cat("attn+rope decode ctx=", ctx, " ", v, " (32/8, hd128", where, ")"), sec, double(layer_bytes),
             {{"ctx", ctx}, {"n_heads", nh}, {"n_kv_heads", nkv}, {"head_dim", hd}, {"variant", v}, {"layers", layers},
              {"resident_clusters_of_8", cuda::decode_rope_resident_clusters(8)}});
    }
    unsetenv("NF4FLASH_DECODE_FUSED");
    unsetenv("NF4FLASH_DECODE_CLUSTER");
  }
}

}  // namespace nf4flash::kbench
