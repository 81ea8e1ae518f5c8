// Decoder's weight loading: one tensor or one fused tensor onto the backend of the layer being
// loaded (the primary, or the host backend of an offloaded layer), a rank's cut of it when
// sharded, Gemma's (1 + w) norms, and the experts of a mixture-of-experts layer.
#include "core/error.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/weight_loader.h"

namespace nf4flash {

std::string Decoder::layer_name(int i, const char* suffix) { return cat("model.layers.", i, ".", suffix); }

// Gemma's norms scale by (1 + w), computed in f32 as transformers does: the sum is stored.
std::unique_ptr<Weight> Decoder::vector_weight(const WeightStore& store, const std::string& name, int64_t n,
                                               const TpRange* part) {
  const TensorInfo& whole = store.get(name);
  if (whole.numel() != n) fail(whole.file, ": tensor ", name, " has shape ", whole.shape_str(), ", expected [", n, "]");
  TensorInfo t = whole;
  if (part) {  // a bias of a column-parallel linear: this rank's entries
    t.shape = {part->n};
    t.data = whole.data + size_t(part->begin) * dtype_size(whole.dtype);
    t.nbytes = size_t(part->n) * dtype_size(whole.dtype);
  }
  std::unique_ptr<Weight> w;
  if (arch_.gemma && name.size() >= 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0) {
    NF4FLASH_CHECK(!part, "a norm weight is never sharded");
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = 1.0f + host_load(t.data, t.dtype, i);
    TensorInfo plus = t;
    plus.dtype = DType::F32;
    plus.data = reinterpret_cast<const uint8_t*>(v.data());
    plus.nbytes = v.size() * 4;
    w = cur_->upload_dense(plus, policy_store_);
  } else {
    w = cur_->upload_dense(t, policy_store_);
  }
  stats_.weight_bytes += w->resident_bytes();
  if (cur_ != &be_) stats_.offloaded_bytes += w->resident_bytes();
  return w;
}

std::unique_ptr<Weight> Decoder::optional_vector(const WeightStore& store, const std::string& name, int64_t n, bool want,
                                                 const TpRange* part) {
  if (!want) {
    if (store.find(name)) fail(store.source(), ": unexpected tensor ", name, " for architecture ", arch_.name);
    return nullptr;
  }
  return vector_weight(store, name, n, part);
}

WeightCut Decoder::rows_cut(TpRange r, int64_t unit) const {
  return tp_.sharded() ? WeightCut::rows(r.begin * unit, r.n * unit) : WeightCut{};
}

WeightCut Decoder::cols_cut(TpRange r, int64_t unit) const {
  return tp_.sharded() ? WeightCut::cols(r.begin * unit, r.n * unit) : WeightCut{};
}

void Decoder::count_linear(const Weight& w) {
  stats_.weight_bytes += w.resident_bytes();
  if (cur_ != &be_) stats_.offloaded_bytes += w.resident_bytes();
  if (w.kind() == Weight::Kind::Quant4) {
    stats_.quant4_bytes += w.resident_bytes();
    ++stats_.n_quant4;
  } else {
    ++stats_.n_dense_linear;
  }
}

std::unique_ptr<Weight> Decoder::linear_weight(const WeightStore& store, const std::string& name, int64_t rows,
                                               int64_t cols, const WeightPolicy& p, bool allow_quant,
                                               const WeightCut& cut) {
  auto w = load_linear_weight(*cur_, store, name, rows, cols, p, allow_quant, cut);
  count_linear(*w);
  return w;
}

std::vector<std::unique_ptr<Weight>> Decoder::fused_weight(const WeightStore& store, const std::string& name,
                                                          const std::vector<int64_t>& part_rows, int64_t cols,
                                                          const WeightPolicy& p) {
  // this rank's rows of each part: the same range of units (heads or intermediate rows) of each
  std::vector<WeightCut> cuts;
  if (tp_.sharded()) {
    const int64_t hd = cfg_.head_dim;
    if (part_rows.size() == 3)  // q, k, v
      cuts = {rows_cut(tp_.q_heads, hd), rows_cut(tp_.kv_heads, hd), rows_cut(tp_.kv_heads, hd)};
    else  // gate, up
      cuts = {rows_cut(tp_.inter), rows_cut(tp_.inter)};
  }
  auto ws = load_fused_linear(*cur_, store, name, part_rows, cols, p, cuts);
  for (const auto& w : ws) count_linear(*w);
  return ws;
}

// With --quant the experts are quantized on load like any linear (a 4-bit decode step then reads
// only the selected experts' codes), and so is the shared expert's gate (an nn.Linear, 4-bit under
// bitsandbytes); the router stays dense. A pre-quantized folder loads as
// transformers 5 + bitsandbytes write it: experts and router dense (not nn.Linear there), the
// shared expert and its gate 4-bit. Sharded: every expert (and the shared one) split
// by its intermediate rows like a dense MLP; the router and the shared expert's gate replicated.
std::unique_ptr<MoeWeights> Decoder::moe_weights(const WeightStore& store, int layer, const WeightPolicy& p) {
  const int64_t H = cfg_.hidden_size, E = cfg_.moe.n_experts, I = cfg_.moe.expert_intermediate;
  const bool mixtral = arch_.moe == ArchFlags::Moe::Mixtral;
  const std::string base = mixtral ? "block_sparse_moe." : "mlp.";
  auto m = std::make_unique<MoeWeights>();
  m->router = linear_weight(store, layer_name(layer, (base + "gate.weight").c_str()), E, H, p, false, {});
  const WeightCut in_rows = rows_cut(tp_.expert_inter), in_cols = cols_cut(tp_.expert_inter);
  for (int64_t e = 0; e < E; ++e) {
    const std::string pre = cat(base, "experts.", e, ".");
    ExpertWeights x;
    x.gate = linear_weight(store, layer_name(layer, (pre + (mixtral ? "w1" : "gate_proj") + ".weight").c_str()), I, H, p, true, in_rows);
    x.up = linear_weight(store, layer_name(layer, (pre + (mixtral ? "w3" : "up_proj") + ".weight").c_str()), I, H, p, true, in_rows);
    x.down = linear_weight(store, layer_name(layer, (pre + (mixtral ? "w2" : "down_proj") + ".weight").c_str()), H, I, p, true, in_cols);
    m->experts.push_back(std::move(x));
  }
  std::vector<Backend::ExpertRefs> refs;
  for (const ExpertWeights& x : m->experts) refs.push_back({x.gate.get(), x.up.get(), x.down.get()});
  m->set = cur_->make_expert_set(refs);
  if (!m->set && cur_->device() != Device::CPU)
    fail(cfg_.source, ": the ", cur_->name(), " backend has no expert set for this mixture of experts");
  if (const int64_t S = cfg_.moe.shared_intermediate; S > 0) {
    const WeightCut s_rows = rows_cut(tp_.shared_inter), s_cols = cols_cut(tp_.shared_inter);
    m->shared.gate = linear_weight(store, layer_name(layer, "mlp.shared_expert.gate_proj.weight"), S, H, p, true, s_rows);
    m->shared.up = linear_weight(store, layer_name(layer, "mlp.shared_expert.up_proj.weight"), S, H, p, true, s_rows);
    m->shared.down = linear_weight(store, layer_name(layer, "mlp.shared_expert.down_proj.weight"), H, S, p, true, s_cols);
    m->shared_gate = linear_weight(store, layer_name(layer, "mlp.shared_expert_gate.weight"), 1, H, p, true, {});
  }
  return m;
}


}  // namespace nf4flash
