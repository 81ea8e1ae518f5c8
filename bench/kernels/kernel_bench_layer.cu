// kernel-bench rows "decode layer full": one whole decode layer in the decoder's fused order (norm +
// q/k/v; rope + cache write + attention at ctx 512; o + residual; norm + gate/up + SiLU; down +
// residual), layers rotated over the weight sets (one cache layer each). Against "decode layer
// GEMVs" (kernel_bench.cu), what the layer's attention costs inside the chain of launches, and what
// running the GEMVs from o to the next layer's q/k/v as one launch (linear_chain,
// NF4FLASH_GEMV_CHAIN=1) gives. bench_dense_layer: the same layer with bf16 weights, its four GEMV
// launches one by one and back to back, then the whole layer (the bf16 target's breakdown).
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernel_bench_util.h"
#include "core/dtype.h"
#include "core/error.h"

namespace nf4flash::kbench {

void bench_decode_layer_full(Backend& be, std::vector<LayerSet>& sets, const LayerActs& a, double layer_bytes,
                             int reps, int trials, std::mt19937& g, const ReportFn& report, const char* wlabel,
                             const std::vector<std::string>& variants) {
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
  // empty: 1 = the attention's launches, 2 = every launch of the layer replaced by an empty one
  // (cuda::EmptyLaunches: the launches and their dependencies without their work)
  auto full = [&](int i, bool attn, bool chain, int empty) {
    cuda::EmptyLaunches all(empty == 2);
    LayerSet& st = sets[size_t(i % copies)];
    Backend::LinearOut outs[3];
    qkv_of(st, outs);
    if (!chain) be.rms_norm_linear_multi(a.resid, *nw, 1e-5f, xn, outs, 3);
    if (attn) {
      cuda::EmptyLaunches attn_only(empty == 1);
      be.rope_kv_attention(i % copies, a.q, a.k, a.v, att, rp, ap, ss);
    }
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
  for (const std::string& m : variants) {
    const char* v = m.c_str();
    const bool chain = m.find("chain") != std::string::npos, attn = m.rfind("none", 0) != 0;
    const int empty = m == "attn empty" ? 1 : m == "all empty" ? 2 : 0;
    if (chain && !one_launch) {
      std::printf("decode layer full ... %s: skipped (the chain does not run as one launch here)\n", v);
      continue;
    }
    setenv("NF4FLASH_GEMV_CHAIN", chain ? "1" : "0", 1);
    setenv("NF4FLASH_DECODE_FUSED", m.rfind("fused", 0) == 0 ? "1" : "0", 1);  // "attn empty": unfused
    setenv("NF4FLASH_DECODE_CLUSTER", m == "fused c1" ? "1" : "8", 1);
    const double sec = time_graph(be, [&](int i) { full(i, attn, chain, empty); }, reps, trials);
    report(cat("decode layer full ", wlabel, " T=1 ctx=", ctx, " attn ", v), sec,
           empty == 2 ? 0.0 : layer_bytes + (attn && !empty ? kv_bytes : 0.0),
           {{"ctx", ctx}, {"attention", v}, {"copies", copies}, {"chain", chain}, {"empty", empty}});
  }
  unsetenv("NF4FLASH_GEMV_CHAIN");
  unsetenv("NF4FLASH_DECODE_FUSED");
  unsetenv("NF4FLASH_DECODE_CLUSTER");
}

void bench_dense_layer(Backend& be, const LayerActs& a, int reps, int trials, std::mt19937& g, const ReportFn& report) {
  const int64_t H = a.x.cols, KV = a.k.cols, I = a.g.cols;
  std::vector<LayerSet> sets(2);  // 2 x 436 MB: every replay reads its weights from HBM
  uint32_t seed = 1;
  auto dense = [&](const char* nm, int64_t N, int64_t K) {
    auto w = upload_bf16_pattern(be, nm, N, K, seed);
    seed += uint32_t(N * K);
    return w;
  };
  for (auto& st : sets) {
    st.q = dense("q", H, H), st.k = dense("k", KV, H), st.v = dense("v", KV, H), st.o = dense("o", H, H);
    st.gate = dense("gate", I, H), st.up = dense("up", I, H), st.down = dense("down", H, I);
  }
  const double qkv = 2.0 * (H + 2 * KV) * H, o = 2.0 * H * H, gu = 4.0 * I * H, dn = 2.0 * I * H;
  auto at = [&](int i) -> LayerSet& { return sets[size_t(i % 2)]; };
  auto qkv_launch = [&](int i) {
    const Backend::LinearOut outs[3] = {{at(i).q.get(), nullptr, a.q}, {at(i).k.get(), nullptr, a.k},
                                        {at(i).v.get(), nullptr, a.v}};
    be.linear_multi(a.x, outs, 3);
  };
  auto o_launch = [&](int i) { be.linear_residual(a.x, *at(i).o, nullptr, a.tmp, a.resid); };
  auto gu_launch = [&](int i) { be.linear_swiglu(a.x, *at(i).gate, nullptr, *at(i).up, nullptr, a.g, a.u); };
  auto dn_launch = [&](int i) { be.linear_residual(a.u, *at(i).down, nullptr, a.tmp, a.resid); };
  const struct {
    const char* name;
    std::function<void(int)> f;
    double bytes;
  } rows[] = {{"gemv bf16 qkv 6144x4096 T=1", qkv_launch, qkv},
              {"gemv bf16 o+residual 4096x4096 T=1", o_launch, o},
              {"gemv bf16 gate+up+silu 2x14336x4096 T=1", gu_launch, gu},
              {"gemv bf16 down+residual 4096x14336 T=1", dn_launch, dn},
              {"decode layer GEMVs bf16 T=1",
               [&](int i) { qkv_launch(i), o_launch(i), gu_launch(i), dn_launch(i); }, qkv + o + gu + dn}};
  for (const auto& r : rows) report(r.name, time_graph(be, r.f, reps, trials), r.bytes, {{"copies", 2}});
  // the whole layer in the decoder's order (the backend's bf16 defaults), with and without attention
  bench_decode_layer_full(be, sets, a, qkv + o + gu + dn, reps, trials, g, report, "bf16",
                          {"unfused", "none", "attn empty"});
}

}  // namespace nf4flash::kbench
