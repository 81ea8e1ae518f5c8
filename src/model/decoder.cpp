#include "model/decoder.h"

#include <cmath>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/rope.h"
#include "model/weight_loader.h"
#include "parallel/communicator.h"

namespace nf4flash {

namespace {
std::string layer_name(int i, const char* suffix) { return cat("model.layers.", i, ".", suffix); }
}  // namespace

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
    w = be_.upload_dense(plus, policy_store_);
  } else {
    w = be_.upload_dense(t, policy_store_);
  }
  stats_.weight_bytes += w->resident_bytes();
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

void Decoder::all_reduce(Act a) {
  if (tp_.sharded()) shard_.comm->all_reduce_sum(a);
}

void Decoder::zero(Act a) {
  if (zeros_.size() < a.bytes()) zeros_.assign(a.bytes(), 0);
  be_.upload(a.data, zeros_.data(), a.bytes());
}

void Decoder::count_linear(const Weight& w) {
  stats_.weight_bytes += w.resident_bytes();
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
  auto w = load_linear_weight(be_, store, name, rows, cols, p, allow_quant, cut);
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
  auto ws = load_fused_linear(be_, store, name, part_rows, cols, p, cuts);
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
  if (const int64_t S = cfg_.moe.shared_intermediate; S > 0) {
    const WeightCut s_rows = rows_cut(tp_.shared_inter), s_cols = cols_cut(tp_.shared_inter);
    m->shared.gate = linear_weight(store, layer_name(layer, "mlp.shared_expert.gate_proj.weight"), S, H, p, true, s_rows);
    m->shared.up = linear_weight(store, layer_name(layer, "mlp.shared_expert.up_proj.weight"), S, H, p, true, s_rows);
    m->shared.down = linear_weight(store, layer_name(layer, "mlp.shared_expert.down_proj.weight"), H, S, p, true, s_cols);
    m->shared_gate = linear_weight(store, layer_name(layer, "mlp.shared_expert_gate.weight"), 1, H, p, true, {});
  }
  return m;
}

Decoder::Decoder(const ModelConfig& cfg, const ArchFlags& arch, Backend& backend, const WeightStore& store,
                 const WeightPolicy& policy, int64_t max_rows, const std::function<void(int, int)>& progress,
                 const TpShard& tp)
    : cfg_(cfg), arch_(arch), shard_(tp), tp_(nf4flash::tp_layout(cfg, tp)), moe_cfg_(cfg), be_(backend),
      max_rows_(max_rows), policy_store_(policy.dense_store) {
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
  const int hd = cfg.head_dim, nh = cfg.n_heads, nkv = cfg.n_kv_heads;
  const bool sharded = tp_.sharded();
  if (sharded && shard_.comm->device() != be_.device())
    fail("tensor parallel: rank ", tp.rank, "'s communicator reduces ", shard_.comm->device() == Device::CPU ? "host" : "device",
         " buffers but its backend is ", be_.name());
  moe_cfg_.moe.expert_intermediate = tp_.expert_inter.n;
  moe_cfg_.moe.shared_intermediate = tp_.shared_inter.n;
  const int total = cfg.n_layers + 2;
  if (arch.moe != ArchFlags::Moe::None) {
    if (be_.device() != Device::CPU)
      fail(cfg.source, ": mixture-of-experts models (", arch.name, ") run on the CPU backend only so far (use --device cpu)");
    moe_block_ = std::make_unique<MoeBlock>(be_, moe_cfg_);
  }
  int done = 0;
  auto tick = [&] { if (progress) progress(++done, total); };

  {
    const TensorInfo& e = store.get("model.embed_tokens.weight");
    if (e.shape.size() != 2 || e.shape[0] != V || e.shape[1] != H)
      fail(e.file, ": model.embed_tokens.weight has shape ", e.shape_str(), ", expected [", V, ", ", H, "]");
    // a tied table is the lm_head too, unless --quant-lm-head makes a 4-bit copy of it for that or
    // the ranks split it by vocabulary for that (each rank looks up every id in the whole table)
    embed_ = be_.upload_embedding(e, policy.dense_store, cfg.tie_embeddings && !policy.quant_lm_head && !sharded);
    stats_.weight_bytes += embed_->resident_bytes();
  }
  tick();
  layers_.resize(cfg.n_layers);
  for (int i = 0; i < cfg.n_layers; ++i) {
    LayerWeights& L = layers_[i];
    L.attn_norm = vector_weight(store, layer_name(i, "input_layernorm.weight"), H);
    if (arch.gemma) {  // post_attention_layernorm normalizes the attention output there
      L.post_attn_norm = vector_weight(store, layer_name(i, "post_attention_layernorm.weight"), H);
      L.mlp_norm = vector_weight(store, layer_name(i, "pre_feedforward_layernorm.weight"), H);
      L.post_mlp_norm = vector_weight(store, layer_name(i, "post_feedforward_layernorm.weight"), H);
    } else {
      L.mlp_norm = vector_weight(store, layer_name(i, "post_attention_layernorm.weight"), H);
    }
    // this rank's q heads and kv heads (all of them unsharded; a rank may hold no q heads when
    // there are fewer than ranks: it then has no attention weights), its intermediate rows
    const TpRange q_rows{tp_.q_heads.begin * hd, tp_.q_heads.n * hd}, kv_rows{tp_.kv_heads.begin * hd, tp_.kv_heads.n * hd};
    const TpRange* q_part = sharded ? &q_rows : nullptr;
    const TpRange* kv_part = sharded ? &kv_rows : nullptr;
    const TpRange* i_part = sharded ? &tp_.inter : nullptr;
    const bool bias_here = !sharded || tp_.bias_rank();  // the o_proj/down biases: added once
    if (tp_.q_heads.n > 0) {
      if (arch.fused_qkv) {
        auto w = fused_weight(store, layer_name(i, "self_attn.qkv_proj.weight"),
                              {int64_t{nh} * hd, int64_t{nkv} * hd, int64_t{nkv} * hd}, H, policy);
        L.wq = std::move(w[0]);
        L.wk = std::move(w[1]);
        L.wv = std::move(w[2]);
      } else {
        L.wq = linear_weight(store, layer_name(i, "self_attn.q_proj.weight"), int64_t{nh} * hd, H, policy, true,
                             rows_cut(tp_.q_heads, hd));
        L.wk = linear_weight(store, layer_name(i, "self_attn.k_proj.weight"), int64_t{nkv} * hd, H, policy, true,
                             rows_cut(tp_.kv_heads, hd));
        L.wv = linear_weight(store, layer_name(i, "self_attn.v_proj.weight"), int64_t{nkv} * hd, H, policy, true,
                             rows_cut(tp_.kv_heads, hd));
      }
      L.wo = linear_weight(store, layer_name(i, "self_attn.o_proj.weight"), H, int64_t{nh} * hd, policy, true,
                           cols_cut(tp_.q_heads, hd));
      L.bq = optional_vector(store, layer_name(i, "self_attn.q_proj.bias"), int64_t{nh} * hd, arch.q_bias, q_part);
      L.bk = optional_vector(store, layer_name(i, "self_attn.k_proj.bias"), int64_t{nkv} * hd, arch.k_bias, kv_part);
      L.bv = optional_vector(store, layer_name(i, "self_attn.v_proj.bias"), int64_t{nkv} * hd, arch.v_bias, kv_part);
      if (bias_here) L.bo = optional_vector(store, layer_name(i, "self_attn.o_proj.bias"), H, arch.o_bias);
      L.q_norm = optional_vector(store, layer_name(i, "self_attn.q_norm.weight"), hd, arch.qk_norm);
      L.k_norm = optional_vector(store, layer_name(i, "self_attn.k_norm.weight"), hd, arch.qk_norm);
    }
    if (arch.moe != ArchFlags::Moe::None && cfg.moe.sparse(i)) {
      L.moe = moe_weights(store, i, policy);
    } else if (arch.fused_gate_up) {
      auto w = fused_weight(store, layer_name(i, "mlp.gate_up_proj.weight"), {I, I}, H, policy);
      L.gate = std::move(w[0]);
      L.up = std::move(w[1]);
    } else {
      L.gate = linear_weight(store, layer_name(i, "mlp.gate_proj.weight"), I, H, policy, true, rows_cut(tp_.inter));
      L.up = linear_weight(store, layer_name(i, "mlp.up_proj.weight"), I, H, policy, true, rows_cut(tp_.inter));
    }
    if (!L.moe) L.down = linear_weight(store, layer_name(i, "mlp.down_proj.weight"), H, I, policy, true, cols_cut(tp_.inter));
    L.b_gate = optional_vector(store, layer_name(i, "mlp.gate_proj.bias"), I, arch.mlp_bias, i_part);
    L.b_up = optional_vector(store, layer_name(i, "mlp.up_proj.bias"), I, arch.mlp_bias, i_part);
    if (bias_here) L.b_down = optional_vector(store, layer_name(i, "mlp.down_proj.bias"), H, arch.mlp_bias);
    tick();
  }
  final_norm_ = vector_weight(store, "model.norm.weight", H);
  {
    // --quant-lm-head: the output projection quantized like the other linears, from lm_head.weight
    // or, when tied, from the embedding table (which stays dense for the lookups); a dense lm_head
    // of a pre-quantized checkpoint (bitsandbytes keeps it so) is quantized on load. Sharded: this
    // rank's vocabulary rows, of the tied table too.
    const char* head = cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    WeightPolicy hp = policy;
    if (policy.quant_lm_head && store.get(head).dtype != DType::U8) hp.prequantized = false;
    if (!cfg.tie_embeddings || policy.quant_lm_head || sharded)
      lm_head_ = linear_weight(store, head, V, H, hp, policy.quant_lm_head, rows_cut(tp_.vocab));
  }
  tick();

  // RoPE frequencies and attention parameters
  const std::vector<float> inv = rope_inv_freq(cfg.rope, hd);
  inv_freq_buf_ = be_.alloc(inv.size() * 4);
  be_.upload(inv_freq_buf_->data(), inv.data(), inv.size() * 4);
  rope_.head_dim = hd;
  rope_.inv_freq = static_cast<const float*>(inv_freq_buf_->data());
  if (cfg.rope.type == "dynamic" && be_.device() != Device::CPU)
    fail(cfg.source, ": dynamic NTK rope scaling runs on the CPU backend only so far (use --device cpu)");
  if (cfg.rope.type == "yarn") rope_.mscale = static_cast<float>(cfg.rope.attention_factor);
  if (cfg.rope.type == "dynamic") {
    rope_.dynamic_after = cfg.rope.dynamic_max_positions;
    rope_.dynamic_table = [rope = cfg.rope, hd](int64_t L, float* out) {
      const std::vector<float> t = rope_inv_freq_dynamic(rope, hd, L);
      std::copy(t.begin(), t.end(), out);
    };
  }
  if (cfg.rope.type == "longrope") {
    const std::vector<float> lng = rope_inv_freq_long(cfg.rope, hd);
    inv_freq_long_buf_ = be_.alloc(lng.size() * 4);
    be_.upload(inv_freq_long_buf_->data(), lng.data(), lng.size() * 4);
    rope_.inv_freq_long = static_cast<const float*>(inv_freq_long_buf_->data());
    rope_.long_after = cfg.rope.original_max_positions;
    rope_.mscale = static_cast<float>(cfg.rope.attention_factor);
  }
  attn_.n_heads = static_cast<int>(tp_.q_heads.n);
  attn_.n_kv_heads = static_cast<int>(tp_.kv_heads.n);
  attn_.head_dim = hd;
  attn_.scale = 1.0f / std::sqrt(static_cast<float>(cfg.query_pre_attn_scalar > 0 ? cfg.query_pre_attn_scalar : hd));
  attn_.softcap = static_cast<float>(cfg.attn_softcap);
  // Gemma's embedding scale sqrt(hidden), a tensor of the compute dtype in transformers
  embed_scale_ = static_cast<float>(std::sqrt(static_cast<double>(H)));
  if (be_.act_dtype() == DType::BF16) embed_scale_ = round_bf16(embed_scale_);
  if (be_.act_dtype() == DType::F16) embed_scale_ = round_f16(embed_scale_);
  if (cfg.has_local_rope) {  // Gemma 3's sliding layers
    const std::vector<float> loc = rope_inv_freq(cfg.local_rope, hd);
    inv_freq_local_buf_ = be_.alloc(loc.size() * 4);
    be_.upload(inv_freq_local_buf_->data(), loc.data(), loc.size() * 4);
    rope_local_ = rope_;
    rope_local_.inv_freq = static_cast<const float*>(inv_freq_local_buf_->data());
  }

  // the largest row count whose linear_swiglu needs the gate buffer (asked once, from the top: every
  // count above it was asked and needs none; counts below get the buffer whether they need it or
  // not), then the workspace for the first forwards (grown on demand up to max_rows)
  if (arch_.gemma) gtmp_rows_ = max_rows_;  // GeGLU is gate, up, then gelu_tanh_mul: always both products
  for (int64_t T = max_rows_; T >= 1 && !gtmp_rows_; --T) {
    for (const LayerWeights& L : layers_) {
      if (L.gate && be_.linear_swiglu_needs_tmp(*L.gate, *L.up, T, L.b_gate || L.b_up)) {
        gtmp_rows_ = T;
        break;
      }
    }
  }
  ensure_workspace(std::min<int64_t>(max_rows, 512));
}

// The activation workspace, in elements per row: x, o, the normed x (which the attention output
// reuses: xn is dead once q/k/v are computed, att once o is), and one region for gate/up that
// q/k/v share (the attention half of a layer and its MLP half never hold both). forward() starts
// the region's later views on kWsAlign-element boundaries, so it carries two alignments of slack.
// The region holds the gate product only for row counts whose linear_swiglu needs it (gu_elems).
Decoder::WsLayout Decoder::ws_layout() const {
  const int64_t H = cfg_.hidden_size, I = tp_.inter.n, hd = cfg_.head_dim;
  const int64_t nh = tp_.q_heads.n, nkv = tp_.kv_heads.n;
  WsLayout l;
  l.xn_cols = std::max(H, nh * hd);
  l.gu_cols = std::max(2 * I, nh * hd + 2 * nkv * hd);
  l.row_elems = 2 * H + l.xn_cols + l.gu_cols;
  return l;
}

int64_t Decoder::gu_elems(int64_t rows) const {
  const int64_t I = tp_.inter.n;
  const int64_t qkv = (tp_.q_heads.n + 2 * tp_.kv_heads.n) * cfg_.head_dim;
  return std::max(rows * std::max(I, qkv), 2 * std::min(rows, gtmp_rows_) * I) + 2 * kWsAlign;
}

size_t Decoder::workspace_bytes(int64_t rows) const {
  const WsLayout l = ws_layout();
  return (size_t(rows) * size_t(l.row_elems - l.gu_cols) + size_t(gu_elems(rows))) * dtype_size(be_.act_dtype());
}

void Decoder::ensure_workspace(int64_t rows) {
  if (rows <= ws_rows_) return;
  const int64_t H = cfg_.hidden_size;
  const WsLayout l = ws_layout();
  const int64_t R64 = std::min(max_rows_, std::max(rows, 2 * ws_rows_));
  // the old buffers go first, so growing never holds both
  for (auto* b : {&b_x_, &b_xn_, &b_o_, &b_gu_}) b->reset();
  const size_t es = dtype_size(be_.act_dtype());
  const size_t R = static_cast<size_t>(R64);
  b_x_ = be_.alloc(R * H * es);
  b_xn_ = be_.alloc(R * size_t(l.xn_cols) * es);
  b_o_ = be_.alloc(R * H * es);
  b_gu_ = be_.alloc(size_t(gu_elems(R64)) * es);
  gu_cap_ = gu_elems(R64);
  ws_rows_ = R64;
  ++ws_epoch_;
}

std::string Decoder::linear_path(int64_t rows) const {
  const LayerWeights& L = layers_.at(0);
  return be_.linear_path(L.wq ? *L.wq : lm_head(), rows);
}

void Decoder::forward(const int32_t* ids, int64_t T, const StepState& s, Act logits, int64_t n_logits,
                      const int32_t* logit_rows) {
  NF4FLASH_CHECK(T >= 1 && T <= max_rows_, "forward: ", T, " rows exceed the workspace of ", max_rows_);
  NF4FLASH_CHECK(n_logits >= 1 && n_logits <= T, "forward: n_logits out of range");
  ensure_workspace(T);
  const int64_t H = cfg_.hidden_size, I = tp_.inter.n;
  const int hd = cfg_.head_dim, nh = static_cast<int>(tp_.q_heads.n), nkv = static_cast<int>(tp_.kv_heads.n);
  const DType adt = be_.act_dtype();
  // views of the workspace (ensure_workspace): att reuses xn's buffer, q/k/v the gate/up region
  const size_t es = dtype_size(adt);
  auto view = [&](const std::unique_ptr<Buffer>& b, int64_t elem_off, int64_t cols) {
    return Act{static_cast<char*>(b->data()) + size_t(elem_off) * es, adt, T, cols};
  };
  const int64_t QD = int64_t{nh} * hd, KD = int64_t{nkv} * hd;
  Act x = view(b_x_, 0, H), xn = view(b_xn_, 0, H), o = view(b_o_, 0, H);
  Act att = view(b_xn_, 0, QD);
  auto al = [](int64_t e) { return (e + kWsAlign - 1) / kWsAlign * kWsAlign; };
  Act q = view(b_gu_, 0, QD), k = view(b_gu_, al(T * QD), KD), v = view(b_gu_, al(T * QD) + al(T * KD), KD);
  // gate product, then the SwiGLU output; without the gate buffer (long prompt chunks, see
  // swiglu_tmp) the output starts the region
  const bool gtmp = swiglu_tmp(T);
  Act g = gtmp ? view(b_gu_, 0, I) : Act{nullptr, adt, T, I}, u = view(b_gu_, gtmp ? al(T * I) : 0, I);
  NF4FLASH_CHECK((gtmp ? al(T * I) : 0) + T * I <= gu_cap_, "forward: the workspace's gate/up region is too small");
  const float eps = static_cast<float>(cfg_.rms_eps);

  // Two orders of the same arithmetic, each the measured default where it runs. Prompts, dense
  // weights and the CPU: each sublayer's output o is added to the residual x by the next norm
  // (add_rms_norm: one pass). The 4-bit decode step on CUDA, where the backend folds the norm into
  // the GEMV (fuses_norm_linear): the o and down GEMVs add their output to x in their epilogue and
  // the next GEMV normalizes x in its prologue, two launches per layer fewer. Sharded, the first
  // order: o and down are summed over the ranks before the residual add. Not Gemma: its sublayer
  // outputs are normed before the residual add, and its MLP is GeGLU.
  const bool fused = !tp_.sharded() && !moe_block_ && !arch_.gemma && be_.fuses_norm_linear(*layers_[0].wq, T) &&
                     be_.fuses_norm_linear(*layers_[0].gate, T);
  auto qkv_of = [&](const LayerWeights& L, Backend::LinearOut* o) {
    o[0] = {L.wq.get(), L.bq.get(), q};
    o[1] = {L.wk.get(), L.bk.get(), k};
    o[2] = {L.wv.get(), L.bv.get(), v};
  };
  be_.embed(*embed_, ids, x);
  if (arch_.gemma) be_.scale(x, embed_scale_);
  for (int i = 0; i < cfg_.n_layers; ++i) {
    const LayerWeights& L = layers_[i];
    Backend::LinearOut qkv[3];
    qkv_of(L, qkv);
    if (fused) {
      if (i == 0) be_.rms_norm_linear_multi(x, *L.attn_norm, eps, xn, qkv, 3);  // later: the previous layer's end
    } else {
      if (i == 0) be_.rms_norm(x, *L.attn_norm, eps, xn);
      else be_.add_rms_norm(x, o, *L.attn_norm, eps, xn);
      if (nh > 0) be_.linear_multi(xn, qkv, 3);
    }
    if (nh > 0) {
      if (arch_.qk_norm) {
        be_.rms_norm(q.reshaped(hd), *L.q_norm, eps, q.reshaped(hd));
        be_.rms_norm(k.reshaped(hd), *L.k_norm, eps, k.reshaped(hd));
      }
      AttnParams ap = attn_;
      const bool sliding = cfg_.sliding_layers.size() > size_t(i) && cfg_.sliding_layers[size_t(i)];
      if (sliding) ap.window = cfg_.sliding_window;
      be_.rope_kv_attention(i, q, k, v, att, sliding && cfg_.has_local_rope ? rope_local_ : rope_, ap, s);
    }
    if (fused) {
      // o + residual, norm + gate/up + SiLU, down + residual, the next layer's norm + q/k/v
      be_.linear_residual(att, *L.wo, L.bo.get(), o, x);
      be_.rms_norm_linear_swiglu(x, *L.mlp_norm, eps, xn, *L.gate, L.b_gate.get(), *L.up, L.b_up.get(), g, u);
      be_.linear_residual(u, *L.down, L.b_down.get(), o, x);
      if (i + 1 < cfg_.n_layers) {
        const LayerWeights& N = layers_[i + 1];
        Backend::LinearOut next[3];
        qkv_of(N, next);
        be_.rms_norm_linear_multi(x, *N.attn_norm, eps, xn, next, 3);
      }
    } else {
      if (nh > 0) be_.linear(att, *L.wo, L.bo.get(), o);
      else zero(o);
      all_reduce(o);
      if (L.post_attn_norm) be_.rms_norm(o, *L.post_attn_norm, eps, o);
      be_.add_rms_norm(x, o, *L.mlp_norm, eps, xn);
      if (L.moe) {
        moe_block_->forward(xn, *L.moe, o);
      } else if (arch_.gemma) {
        NF4FLASH_CHECK(g.data, "forward: GeGLU needs the gate buffer");
        be_.linear(xn, *L.gate, L.b_gate.get(), g);
        be_.linear(xn, *L.up, L.b_up.get(), u);
        be_.gelu_tanh_mul(g, u, u);
        be_.linear(u, *L.down, L.b_down.get(), o);
      } else {
        be_.linear_swiglu(xn, *L.gate, L.b_gate.get(), *L.up, L.b_up.get(), g, u);
        be_.linear(u, *L.down, L.b_down.get(), o);
      }
      all_reduce(o);
      if (L.post_mlp_norm) be_.rms_norm(o, *L.post_mlp_norm, eps, o);
    }
  }
  Act last_n = xn.slice_rows(0, n_logits);
  if (logit_rows) {
    // the rows that give logits, gathered (after the last residual add) into o's first rows
    if (!fused) be_.add(x, o, x);
    Act picked = o.slice_rows(0, n_logits);
    be_.gather_rows(x, logit_rows, picked);
    be_.rms_norm(picked, *final_norm_, eps, last_n);
  } else {
    // only the rows that give logits need the last residual add and the final norm
    Act last = x.slice_rows(T - n_logits, n_logits);
    if (fused) be_.rms_norm(last, *final_norm_, eps, last_n);
    else be_.add_rms_norm(last, o.slice_rows(T - n_logits, n_logits), *final_norm_, eps, last_n);
  }
  if (tp_.sharded()) {
    // this rank's vocabulary columns, then every rank's side by side
    const size_t bytes = size_t(n_logits * tp_.vocab.n) * 4;
    if (!b_logits_ || b_logits_->bytes() < bytes) {
      b_logits_ = be_.alloc(bytes);
      ++ws_epoch_;  // a captured step holds the old buffer's address
    }
    const Act mine{b_logits_->data(), DType::F32, n_logits, tp_.vocab.n};
    be_.linear(last_n, lm_head(), nullptr, mine);
    shard_.comm->all_gather_cols(mine, logits);
  } else {
    be_.linear(last_n, lm_head(), nullptr, logits);
  }
  if (cfg_.final_softcap > 0) be_.softcap(logits, static_cast<float>(cfg_.final_softcap));
}

}  // namespace nf4flash
