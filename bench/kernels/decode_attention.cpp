// nf4flash-kernel-bench: decode attention as a decode step runs it: Backend::attention at T = 1
// (AttnImpl::Auto: the split-K flash-decoding kernel and its combine), Llama-3-8B layer shape (32 q
// heads, 8 kv heads, head_dim 128, bf16 cache), at contexts 512, 4096 and 32768. The cache is
// rotated over enough layers (each filled with the same random K/V) that the K/V read comes from
// HBM, as in a decode step, and every layer is visited in each replay. Bytes: the K and V read.
#include <algorithm>
#include <cmath>
#include <string>

#include "bench.h"
#include "core/error.h"

namespace nf4flash::kbench {

void decode_attention(Context& c) {
  Backend& be = c.be;
  const int nh = 32, nkv = 8, hd = 128;
  c.report.section("decode_attention", "decode attention, T=1 (32 q / 8 kv heads, hd 128, bf16 cache from HBM)");
  for (int ctx : {512, 4096, 32768}) {
    const double layer_bytes = double(ctx) * nkv * hd * 2 * 2;
    const int layers = c.copies_for(layer_bytes);
    const int reps = std::max(c.reps, layers);  // every layer once per replay
    be.kv_allocate({layers, nkv, hd, ctx, DType::BF16});
    auto pb = be.alloc(4);
    const StepState st{static_cast<int32_t*>(pb->data())};
    {  // every layer: random K/V at positions 0 .. ctx-1
      const int32_t zero = 0;
      be.upload(pb->data(), &zero, 4);
      auto kvb = randn_bf16(be, size_t(ctx) * nkv * hd, c.rng);
      const Act kv = kvb->as_act(DType::BF16, ctx, nkv * hd);
      for (int l = 0; l < layers; ++l) be.kv_write(l, kv, kv, st);
      be.sync();
    }
    const int32_t last = ctx - 1;  // the step's token attends to all ctx positions
    be.upload(pb->data(), &last, 4);
    auto qb = randn_bf16(be, size_t(nh * hd), c.rng), ob = be.alloc(size_t(nh * hd) * 2);
    const Act q = qb->as_act(DType::BF16, 1, nh * hd), o = ob->as_act(DType::BF16, 1, nh * hd);
    const AttnParams ap{nh, nkv, hd, 1.f / std::sqrt(float(hd)), AttnImpl::Auto};
    const double sec = time_graph(be, [&](int i) { be.attention(i % layers, q, o, ap, st); }, reps, c.trials);
    c.report.row(cat("attn decode ctx=", ctx, " (", layers, " layers)"), sec, layer_bytes, 0,
                 {{"ctx", ctx}, {"n_heads", nh}, {"n_kv_heads", nkv}, {"head_dim", hd}, {"layers", layers}});
  }
  be.kv_allocate({0, nkv, hd, 0, DType::BF16});  // the cache's memory back
}

}  // namespace nf4flash::kbench
