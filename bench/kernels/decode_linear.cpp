// nf4flash-kernel-bench: the decode linears of a Llama-3-8B layer (hidden 4096, intermediate 14336,
// 8 kv heads of 128) as the decoder issues them, through the backend's default path: one weight
// (Backend::linear: q/o 4096x4096, k/v 1024x4096, gate/up 14336x4096, down 4096x14336), q/k/v in
// one call (linear_multi), gate + up + SiLU (linear_swiglu) and down with the residual add
// (linear_residual). 4-bit weights (nf4 and nf4-dq: the decode GEMV) at T = 1, 2, 4, 8 rows, and
// nf4-dq at T = 16, 32, 64 (a batched decode step's rows: the skinny GEMM); bf16
// weights (the dense GEMV) at T = 1, and the bf16 lm_head 128256x4096 with f32 logits. Bytes: the
// weights' resident bytes plus the activations read and written (us, GB/s, % of copy).
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "core/error.h"

namespace nf4flash::kbench {
namespace {

constexpr int64_t kHidden = 4096, kInter = 14336, kKv = 1024;

enum class Op { Linear, Multi, SwiGLU, Residual };
struct Case {
  const char* name;
  Op op;
  std::vector<std::pair<int64_t, int64_t>> shapes;  // the weights [rows, cols] (one cols)
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"4096x4096", Op::Linear, {{kHidden, kHidden}}},
      {"1024x4096", Op::Linear, {{kKv, kHidden}}},
      {"14336x4096", Op::Linear, {{kInter, kHidden}}},
      {"4096x14336", Op::Linear, {{kHidden, kInter}}},
      {"qkv 6144x4096", Op::Multi, {{kHidden, kHidden}, {kKv, kHidden}, {kKv, kHidden}}},
      {"gate+up+silu 2x14336x4096", Op::SwiGLU, {{kInter, kHidden}, {kInter, kHidden}}},
      {"down+residual 4096x14336", Op::Residual, {{kHidden, kInter}}},
  };
  return c;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::Linear: return "linear";
    case Op::Multi: return "linear_multi";
    case Op::SwiGLU: return "linear_swiglu";
    case Op::Residual: return "linear_residual";
  }
  return "?";
}

using WeightSet = std::vector<std::unique_ptr<Weight>>;  // one copy of a case's weights

// One row: the case's op at T rows over the weight copies `sets`, activations random.
void time_case(Context& c, const Case& k, const char* format, const std::vector<WeightSet>& sets, int T) {
  Backend& be = c.be;
  const int64_t K = k.shapes[0].second;
  int64_t out_cols = 0;
  for (auto [r, cols] : k.shapes) out_cols += r;
  auto xb = randn_bf16(be, size_t(T * K), c.rng);
  const Act x = xb->as_act(DType::BF16, T, K);
  std::vector<std::unique_ptr<Buffer>> bufs;
  auto act = [&](int64_t cols) {
    bufs.push_back(randn_bf16(be, size_t(T * cols), c.rng));
    return bufs.back()->as_act(DType::BF16, T, cols);
  };
  std::vector<Act> outs;
  for (auto [r, cols] : k.shapes) outs.push_back(act(r));
  double act_bytes = 2.0 * T * (K + out_cols);
  std::function<void(int)> body;
  const Weight& w0 = *sets[0][0];
  switch (k.op) {
    case Op::Linear:
      body = [&](int i) { be.linear(x, *sets[size_t(i) % sets.size()][0], nullptr, outs[0]); };
      break;
    case Op::Multi:
      body = [&](int i) {
        const WeightSet& s = sets[size_t(i) % sets.size()];
        const Backend::LinearOut lo[3] = {{s[0].get(), nullptr, outs[0]}, {s[1].get(), nullptr, outs[1]},
                                          {s[2].get(), nullptr, outs[2]}};
        be.linear_multi(x, lo, 3);
      };
      break;
    case Op::SwiGLU: {
      act_bytes = 2.0 * T * (K + k.shapes[0].first);  // x in, silu(gate) * up out
      const Act g_tmp = be.linear_swiglu_needs_tmp(w0, *sets[0][1], T, false) ? outs[0] : Act{};
      body = [&, g_tmp](int i) {
        const WeightSet& s = sets[size_t(i) % sets.size()];
        be.linear_swiglu(x, *s[0], nullptr, *s[1], nullptr, g_tmp, outs[1]);
      };
      break;
    }
    case Op::Residual: {
      act_bytes = 2.0 * T * (K + 2 * k.shapes[0].first);  // x in, the residual read and written
      const Act resid = act(k.shapes[0].first);
      body = [&, resid](int i) { be.linear_residual(x, *sets[size_t(i) % sets.size()][0], nullptr, outs[0], resid); };
      break;
    }
  }
  double wbytes = 0;
  for (const auto& w : sets[0]) wbytes += double(w->resident_bytes());
  const double sec = time_graph(be, body, c.reps, c.trials);
  c.report.row(cat("gemv ", format, " ", k.name, " T=", T), sec, wbytes + act_bytes, 0,
               {{"format", format}, {"op", op_name(k.op)}, {"T", T}, {"cols", K}, {"out_features", out_cols},
                {"copies", sets.size()}, {"path", be.linear_path(w0, T)}});
}

// The 4-bit rows: per format and case, one random host tensor per weight shape, uploaded to enough
// copies that they come from HBM.
void q4_rows(Context& c, bool dq) {
  const char* format = dq ? "nf4-dq" : "nf4";
  for (const Case& k : cases()) {
    std::vector<std::shared_ptr<const Quant4Tensor>> host;
    double bytes = 0;
    for (auto [r, cols] : k.shapes) {
      host.push_back(random_q4(r, cols, dq, c.rng));
      bytes += double(r * cols) / 2;
    }
    std::vector<WeightSet> sets(size_t(c.copies_for(bytes)));
    for (WeightSet& s : sets)
      for (const auto& h : host) s.push_back(c.be.upload_quant4(h));
    for (int T : {1, 2, 4, 8}) time_case(c, k, format, sets, T);
    if (dq)
      for (int T : {16, 32, 64}) time_case(c, k, format, sets, T);
  }
}

void bf16_rows(Context& c) {
  for (const Case& k : cases()) {
    std::vector<std::vector<uint16_t>> host;
    double bytes = 0;
    for (auto [r, cols] : k.shapes) {
      host.push_back(bf16_pattern(size_t(r * cols), uint64_t(host.size()) * 7919));
      bytes += 2.0 * double(r * cols);
    }
    std::vector<WeightSet> sets(size_t(c.copies_for(bytes)));
    for (WeightSet& s : sets)
      for (size_t i = 0; i < host.size(); ++i) s.push_back(upload_bf16(c.be, k.shapes[i].first, k.shapes[i].second, host[i]));
    host.clear();
    time_case(c, k, "bf16", sets, 1);
  }
  // the lm_head: one 1 GB weight (a working set past any L2 already), f32 logits
  const int64_t N = 128256, K = kHidden;
  auto w = upload_bf16(c.be, N, K, bf16_pattern(size_t(N * K), 1));
  auto xb = randn_bf16(c.be, size_t(K), c.rng);
  auto yb = c.be.alloc(size_t(N) * 4);
  const Act x = xb->as_act(DType::BF16, 1, K), y = yb->as_act(DType::F32, 1, N);
  const double sec = time_graph(c.be, [&](int) { c.be.linear(x, *w, nullptr, y); }, std::max(4, c.reps / 10), c.trials);
  c.report.row("gemv bf16 lm_head 128256x4096 -> f32 T=1", sec, double(w->resident_bytes()) + 2.0 * K + 4.0 * N, 0,
               {{"format", "bf16"}, {"op", "linear"}, {"T", 1}, {"cols", K}, {"out_features", N}, {"copies", 1},
                {"path", c.be.linear_path(*w, 1)}});
}

}  // namespace

void decode_linears(Context& c) {
  c.report.section("decode_linear_q4", "decode linears, 4-bit (Llama-3-8B layer shapes; weights from HBM)");
  q4_rows(c, false);
  q4_rows(c, true);
  c.report.section("decode_linear_bf16", "decode linears, bf16 (Llama-3-8B layer shapes, lm_head)");
  bf16_rows(c);
}

}  // namespace nf4flash::kbench
