// kernel-bench rows "decode layer full": one whole decode layer in the decoder's fused order (norm +
// q/k/v; rope + cache write + attention at ctx 512; o + residual; norm + gate/up + SiLU; down +
// residual), layers rotated over the weight sets (one cache layer each). Against "decode layer
// GEMVs" (kernel_bench.cu), what the layer's attention costs inside the chain of launches, and what
// running the GEMVs from o to the next layer's q/k/v as one launch (linear_chain,
// NF4FLASH_GEMV_CHAIN=1) gives.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/kernel_bench_util.h"
#include "core/dtype.h"
#include "core/error.h"

namespace nf4flash::kbench {

void bench_decode_layer_full(Backend& be, std::vector<LayerSet>& sets, const LayerActs& a, double layer_bytes,
                             int reps, int trials, std::mt19937& g, const ReportFn& report) {
  const int copies = int(sets.size());
  const int64_t H = a.x.cols;
  const int nh = 32, nkv = 8, hd = 128, ctx = 512;
  be.kv_allocate({copies, nkv, hd, ctx + 8, DType::BF16});
  std::normal_distribution<float> nd;
  std::vector<uint16_t> nwh(static_cast<size_t>(H), uint16_t{0});
  for (auto& v : nwh) v = f32_to_bf16(1.f + 0.1f * nd(g));
  auto kvb = upload_randn_bf16(be, size_t(ctx) * nkv * hd, g), inv = upload_rope_freqs(be, hd, 500000.f);
  auto pb = be.alloc(4), xnb = be.alloc(size_t(H) * 2), atb = be.alloc(size_t(H) * 2);
  const int32_t zero = 0, pos = ctx;
  be.upload(pb->data(), &zero, 4);
  StepState ss{static_cast<int32_t*>(pb->data())};
  for (int c = 0; c < copies; ++c) {
    Act kva = kvb->as_act(DType::BF16, ctx, nkv * hd);
    be.kv_write(c, kva, kva, ss);
  }
  be.upload(pb->data(), &pos, 4);
  be.sync();
  auto nw = be.upload_dense(bf16_tensor("norm", 1, H, nwh), DType::BF16);
  Act xn = xnb->as_act(DType::BF16, 1, H), att = atb->as_act(DType::BF16, 1, H);
  const RopeParams rp{hd, static_cast<const float*>(inv->data())};
  const AttnParams ap{nh, nkv, hd, 0.088f, AttnImpl::Auto};
  auto qkv_of = [&](LayerSet& st, Backend::LinearOut* o) {
    o[0] = {st.q.get(), nullptr, a.q};
    o[1] = {st.k.get(), nullptr, a.k};
    o[2] = {st.v.get(), nullptr, a.v};
  };
  // chain = false: the ops one by one; true: linear_chain from o to the next layer's q/k/v (the
  // decoder's order: the q/k/v at the top of layer i ran at the end of layer i - 1's chain)
  auto full = [&](int i, bool attn, bool chain) {
    LayerSet& st = sets[size_t(i % copies)];
    Backend::LinearOut outs[3];
    qkv_of(st, outs);
    if (!chain) be.rms_norm_linear_multi(a.resid, *nw, 1e-5f, xn, outs, 3);
    if (attn) be.rope_kv_attention(i % copies, a.q, a.k, a.v, att, rp, ap, ss);
    if (!chain) {
      be.linear_residual(att, *st.o, nullptr, a.tmp, a.resid);
      be.rms_norm_linear_swiglu(a.resid, *nw, 1e-5f, xn, *st.gate, nullptr, *st.up, nullptr, a.g, a.u);
      be.linear_residual(a.u, *st.down, nullptr, a.tmp, a.resid);
      return;
    }
    using Stage = Backend::ChainStage;
    qkv_of(sets[size_t((i + 1) % copies)], outs);
    const Stage ch[4] = {Stage::residual(att, {st.o.get(), nullptr, a.tmp}, a.resid),
                         Stage::norm_swiglu(a.resid, *nw, 1e-5f, xn, {st.gate.get(), nullptr, a.g},
                                            {st.up.get(), nullptr, a.u}),
                         Stage::residual(a.u, {st.down.get(), nullptr, a.tmp}, a.resid),
                         Stage::norm_multi(a.resid, *nw, 1e-5f, xn, outs, 3)};
    be.linear_chain(ch, 4);
  };
  const double kv_bytes = double(ctx) * nkv * hd * 2 * 2;
  bool one_launch = false;  // whether this configuration chains the layer's GEMVs (else no chain rows)
  setenv("NF4FLASH_GEMV_CHAIN", "1", 1);
  {
    const auto o = Backend::ChainStage::residual(att, {sets[0].o.get(), nullptr, a.tmp}, a.resid);
    const Backend::ChainStage ch[2] = {o, o};
    one_launch = be.chain_is_one_launch(ch, 2);
  }
  // the attention: 3 launches, 1 (clusters of 8 or plain blocks), left out; the GEMVs chained
  for (const char* v : {"unfused", "fused", "fused c1", "none", "unfused chain", "none chain"}) {
    const std::string m = v;
    const bool chain = m.find("chain") != std::string::npos, attn = m.rfind("none", 0) != 0;
    if (chain && !one_launch) {
      std::printf("decode layer full ... %s: skipped (the chain does not run as one launch here)\n", v);
      continue;
    }
    setenv("NF4FLASH_GEMV_CHAIN", chain ? "1" : "0", 1);
    setenv("NF4FLASH_DECODE_FUSED", m.rfind("fused", 0) == 0 ? "1" : "0", 1);
    setenv("NF4FLASH_DECODE_CLUSTER", m == "fused c1" ? "1" : "8", 1);
    const double sec = time_graph(be, [&](int i) { full(i, attn, chain); }, reps, trials);
    report(cat("decode layer full nf4-dq T=1 ctx=", ctx, " attn ", v), sec, layer_bytes + (attn ? kv_bytes : 0.0),
           {{"ctx", ctx}, {"attention", v}, {"copies", copies}, {"chain", chain}});
  }
  unsetenv("NF4FLASH_GEMV_CHAIN");
  unsetenv("NF4FLASH_DECODE_FUSED");
  unsetenv("NF4FLASH_DECODE_CLUSTER");
}

}  // namespace nf4flash::kbench
