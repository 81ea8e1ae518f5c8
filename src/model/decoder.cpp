#include "model/decoder.h"

#include <cmath>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/rope.h"
#include "model/weight_loader.h"
#include "parallel/communicator.h"

namespace nf4flash {

// The offload backend's share: its layers' workspace, RoPE tables, MoE block and the mirrors of a
// step's device arrays (positions, block tables).
struct Decoder::Offload {
  Offload(Backend& b, int f) : be(b), first(f) {}
  Backend& be;
  int first;  // layers [first, n_layers)
  int64_t gtmp_rows = 0, gu_cap = 0;
  std::unique_ptr<Buffer> x, xn, o, gu;
  std::unique_ptr<Buffer> inv_freq, inv_freq_long, inv_freq_local;
  RopeParams rope, rope_local;
  std::unique_ptr<MoeBlock> moe;
  struct Mirror {  // a step's device array, copied here
    std::unique_ptr<Buffer> buf;
    size_t cap = 0;  // int32 entries
  };
  Mirror pos0, row_start, seq_pos0, tables;
  PagedSeqs paged;
  std::unique_ptr<Buffer> host;  // the hidden state crossing between the backends (the primary's staging memory)
  std::vector<int32_t> ints;
};

Decoder::~Decoder() = default;

int Decoder::offload_first_layer() const { return off_ ? off_->first : cfg_.n_layers; }

void Decoder::all_reduce(Act a) {
  if (tp_.sharded()) shard_.comm->all_reduce_sum(a);
}

void Decoder::zero(Act a) {
  if (zeros_.size() < a.bytes()) zeros_.assign(a.bytes(), 0);
  be_.upload(a.data, zeros_.data(), a.bytes());
}

Decoder::Decoder(const ModelConfig& cfg, const ArchFlags& arch, Backend& backend, const WeightStore& store,
                 const WeightPolicy& policy, int64_t max_rows, const std::function<void(int, int)>& progress,
                 const TpShard& tp, const OffloadSplit& offload)
    : cfg_(cfg), arch_(arch), shard_(tp), tp_(nf4flash::tp_layout(cfg, tp, policy.quant != QuantType::None || policy.prequantized ? policy.blocksize : 1)), moe_cfg_(cfg), be_(backend),
      max_rows_(max_rows), policy_store_(policy.dense_store) {
  cur_ = &be_;
  if (offload.backend && offload.first_layer < cfg.n_layers) {
    if (offload.first_layer < 0)
      fail("offload: first offloaded layer ", offload.first_layer, " out of range (0..", cfg.n_layers, ")");
    if (tp.world > 1) fail("offload: layers on a second backend are not combined with tensor parallel");
    if (offload.backend == &be_) fail("offload: the offload backend is the primary backend");
    off_ = std::make_unique<Offload>(*offload.backend, offload.first_layer);
  }
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
    moe_block_ = std::make_unique<MoeBlock>(be_, moe_cfg_);
    if (off_) off_->moe = std::make_unique<MoeBlock>(off_->be, moe_cfg_);
  }
  int done = 0;
  auto tick = [&] { if (progress) progress(++done, total); };

  {
    const TensorInfo& e = store.get("model.embed_tokens.weight");
    if (e.shape.size() != 2 || e.shape[0] != V || e.shape[1] != H)
      fail(e.file, ": model.embed_tokens.weight has shape ", e.shape_str(), ", expected [", V, ", ", H, "]");
    // a tied table is the lm_head too, unless --quant-lm-head makes a 4-bit copy of it for that.
    // Sharded: this rank's vocabulary rows (the lookup gives zeros for the others' ids, and the
    // ranks' rows are summed), which are also its lm_head rows when tied.
    std::vector<uint8_t> keep;
    embed_ = be_.upload_embedding(cut_dense(e, V, H, rows_cut(tp_.vocab), keep), policy.dense_store,
                                  cfg.tie_embeddings && !policy.quant_lm_head);
    stats_.weight_bytes += embed_->resident_bytes();
  }
  tick();
  layers_.resize(cfg.n_layers);
  for (int i = 0; i < cfg.n_layers; ++i) {
    LayerWeights& L = layers_[i];
    cur_ = off_ && i >= off_->first ? &off_->be : &be_;
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
  cur_ = &be_;
  final_norm_ = vector_weight(store, "model.norm.weight", H);
  {
    // --quant-lm-head: the output projection quantized like the other linears, from lm_head.weight
    // or, when tied, from the embedding table (which stays dense for the lookups); a dense lm_head
    // of a pre-quantized checkpoint (bitsandbytes keeps it so) is quantized on load. Sharded: this
    // rank's vocabulary rows.
    const char* head = cfg.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    WeightPolicy hp = policy;
    if (policy.quant_lm_head && store.get(head).dtype != DType::U8) hp.prequantized = false;
    if (!cfg.tie_embeddings || policy.quant_lm_head)
      lm_head_ = linear_weight(store, head, V, H, hp, policy.quant_lm_head, rows_cut(tp_.vocab));
  }
  tick();

  // RoPE frequencies (a copy on each backend) and attention parameters
  auto table = [](Backend& b, const std::vector<float>& v) {
    auto buf = b.alloc(v.size() * 4);
    b.upload(buf->data(), v.data(), v.size() * 4);
    return buf;
  };
  const std::vector<float> inv = rope_inv_freq(cfg.rope, hd);
  inv_freq_buf_ = table(be_, inv);
  rope_.head_dim = hd;
  rope_.inv_freq = static_cast<const float*>(inv_freq_buf_->data());
  if (cfg.rope.type == "yarn") rope_.mscale = static_cast<float>(cfg.rope.attention_factor);
  if (cfg.rope.type == "dynamic") {
    rope_.dynamic_after = cfg.rope.dynamic_max_positions;
    rope_.dynamic_theta = static_cast<float>(cfg.rope.theta);
    rope_.dynamic_factor = static_cast<float>(cfg.rope.factor);
    rope_.dynamic_table = [rope = cfg.rope, hd](int64_t L, float* out) {
      const std::vector<float> t = rope_inv_freq_dynamic(rope, hd, L);
      std::copy(t.begin(), t.end(), out);
    };
  }
  const std::vector<float> lng = cfg.rope.type == "longrope" ? rope_inv_freq_long(cfg.rope, hd) : std::vector<float>{};
  const std::vector<float> loc = cfg.has_local_rope ? rope_inv_freq(cfg.local_rope, hd) : std::vector<float>{};
  if (!lng.empty()) {
    inv_freq_long_buf_ = table(be_, lng);
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
  if (!loc.empty()) {  // Gemma 3's sliding layers
    inv_freq_local_buf_ = table(be_, loc);
    rope_local_ = rope_;
    rope_local_.inv_freq = static_cast<const float*>(inv_freq_local_buf_->data());
  }
  if (off_) {  // the same parameters over the offload backend's copies of the tables
    Offload& f = *off_;
    f.inv_freq = table(f.be, inv);
    f.rope = rope_;
    f.rope.inv_freq = static_cast<const float*>(f.inv_freq->data());
    if (!lng.empty()) {
      f.inv_freq_long = table(f.be, lng);
      f.rope.inv_freq_long = static_cast<const float*>(f.inv_freq_long->data());
    }
    if (!loc.empty()) {
      f.inv_freq_local = table(f.be, loc);
      f.rope_local = f.rope;
      f.rope_local.inv_freq = static_cast<const float*>(f.inv_freq_local->data());
    }
  }

  // the largest row counts whose linear_swiglu needs the gate buffer (per backend), then the
  // workspace for the first forwards (grown on demand up to max_rows)
  const int split = offload_first_layer();
  gtmp_rows_ = gate_tmp_rows(be_, 0, split);
  if (off_) off_->gtmp_rows = gate_tmp_rows(off_->be, split, cfg.n_layers);
  ensure_workspace(std::min<int64_t>(max_rows, 512));
}

// Asked once per row count, from the top: every count above the result was asked and needs none;
// counts below get the buffer whether they need it or not. Gemma's GeGLU is gate, up, then
// gelu_tanh_mul: always both products.
int64_t Decoder::gate_tmp_rows(Backend& b, int i0, int i1) const {
  if (arch_.gemma) return max_rows_;
  for (int64_t T = max_rows_; T >= 1; --T)
    for (int i = i0; i < i1; ++i) {
      const LayerWeights& L = layers_[size_t(i)];
      if (L.gate && b.linear_swiglu_needs_tmp(*L.gate, *L.up, T, L.b_gate || L.b_up)) return T;
    }
  return 0;
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

namespace {
int64_t gu_elems_of(int64_t rows, int64_t I, int64_t qkv, int64_t gtmp_rows, int64_t align) {
  return std::max(rows * std::max(I, qkv), 2 * std::min(rows, gtmp_rows) * I) + 2 * align;
}
}  // namespace

int64_t Decoder::gu_elems(int64_t rows) const {
  const int64_t qkv = (tp_.q_heads.n + 2 * tp_.kv_heads.n) * cfg_.head_dim;
  return gu_elems_of(rows, tp_.inter.n, qkv, gtmp_rows_, kWsAlign);
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
  const size_t R = static_cast<size_t>(R64);
  const int64_t qkv = (tp_.q_heads.n + 2 * tp_.kv_heads.n) * cfg_.head_dim;
  auto alloc = [&](Backend& b, int64_t gtmp, std::unique_ptr<Buffer>* bufs[4], int64_t& gu_cap) {
    for (int i = 0; i < 4; ++i) bufs[i]->reset();  // the old buffers go first: growing never holds both
    const size_t es = dtype_size(b.act_dtype());
    gu_cap = gu_elems_of(R64, tp_.inter.n, qkv, gtmp, kWsAlign);
    *bufs[0] = b.alloc(R * H * es);
    *bufs[1] = b.alloc(R * size_t(l.xn_cols) * es);
    *bufs[2] = b.alloc(R * H * es);
    *bufs[3] = b.alloc(size_t(gu_cap) * es);
  };
  std::unique_ptr<Buffer>* mine[4] = {&b_x_, &b_xn_, &b_o_, &b_gu_};
  alloc(be_, gtmp_rows_, mine, gu_cap_);
  if (off_) {
    std::unique_ptr<Buffer>* theirs[4] = {&off_->x, &off_->xn, &off_->o, &off_->gu};
    alloc(off_->be, off_->gtmp_rows, theirs, off_->gu_cap);
  }
  ws_rows_ = R64;
  ++ws_epoch_;
}

std::string Decoder::linear_path(int64_t rows) const {
  const LayerWeights& L = layers_.at(0);
  return (off_ && off_->first == 0 ? off_->be : be_).linear_path(L.wq ? *L.wq : lm_head(), rows);
}

// d (all layers) as the primary's share and the offload backend's (whose CPU cache is f32).
std::pair<KVCacheDesc, KVCacheDesc> Decoder::kv_split(const KVCacheDesc& d) const {
  NF4FLASH_CHECK(d.n_layers == cfg_.n_layers, "kv_allocate: ", d.n_layers, " layers for a model of ", cfg_.n_layers);
  KVCacheDesc mine = d, theirs = d;
  mine.n_layers = offload_first_layer();
  theirs.n_layers = cfg_.n_layers - mine.n_layers;
  if (off_ && off_->be.device() == Device::CPU) theirs.dtype = DType::F32;
  return {mine, theirs};
}

void Decoder::kv_allocate(const KVCacheDesc& d) {
  const auto [mine, theirs] = kv_split(d);
  be_.kv_allocate(mine);
  if (off_) off_->be.kv_allocate(theirs);
}

void Decoder::kv_allocate_paged(const KVCacheDesc& d, int64_t n_blocks, int block_size) {
  const auto [mine, theirs] = kv_split(d);
  be_.kv_allocate_paged(mine, n_blocks, block_size);
  if (off_) off_->be.kv_allocate_paged(theirs, n_blocks, block_size);
}

Decoder::Views Decoder::views(DType adt, Buffer& bx, Buffer& bxn, Buffer& bo, Buffer& bgu, int64_t gu_cap,
                              int64_t T, bool gtmp) const {
  const int64_t H = cfg_.hidden_size, I = tp_.inter.n, hd = cfg_.head_dim;
  const int64_t QD = tp_.q_heads.n * hd, KD = tp_.kv_heads.n * hd;
  const size_t es = dtype_size(adt);
  auto view = [&](Buffer& b, int64_t elem_off, int64_t cols) {
    return Act{static_cast<char*>(b.data()) + size_t(elem_off) * es, adt, T, cols};
  };
  auto al = [](int64_t e) { return (e + kWsAlign - 1) / kWsAlign * kWsAlign; };
  Views v;
  // att reuses xn's buffer, q/k/v the gate/up region
  v.x = view(bx, 0, H), v.xn = view(bxn, 0, H), v.o = view(bo, 0, H), v.att = view(bxn, 0, QD);
  v.q = view(bgu, 0, QD), v.k = view(bgu, al(T * QD), KD), v.v = view(bgu, al(T * QD) + al(T * KD), KD);
  // gate product, then the SwiGLU output; without the gate buffer (long prompt chunks, see
  // swiglu_tmp) the output starts the region
  v.g = gtmp ? view(bgu, 0, I) : Act{nullptr, adt, T, I};
  v.u = view(bgu, gtmp ? al(T * I) : 0, I);
  NF4FLASH_CHECK((gtmp ? al(T * I) : 0) + T * I <= gu_cap, "forward: the workspace's gate/up region is too small");
  return v;
}

void Decoder::run_layers(const LayerRun& r, const Views& v, int i0, int i1, const StepState& s, bool fused) {
  Backend& b = *r.be;
  const int nh = static_cast<int>(tp_.q_heads.n);
  const float eps = static_cast<float>(cfg_.rms_eps);
  const Act &x = v.x, &xn = v.xn, &o = v.o, &att = v.att, &g = v.g, &u = v.u;
  auto qkv_of = [&](const LayerWeights& L, Backend::LinearOut* out) {
    out[0] = {L.wq.get(), L.bq.get(), v.q};
    out[1] = {L.wk.get(), L.bk.get(), v.k};
    out[2] = {L.wv.get(), L.bv.get(), v.v};
  };
  for (int i = i0; i < i1; ++i) {
    const LayerWeights& L = layers_[size_t(i)];
    Backend::LinearOut qkv[3];
    qkv_of(L, qkv);
    if (fused) {
      if (i == i0) b.rms_norm_linear_multi(x, *L.attn_norm, eps, xn, qkv, 3);  // later: the previous layer's end
    } else {
      if (i == i0) b.rms_norm(x, *L.attn_norm, eps, xn);
      else b.add_rms_norm(x, o, *L.attn_norm, eps, xn);
      if (nh > 0) b.linear_multi(xn, qkv, 3);
    }
    if (nh > 0) {
      QkNorm qk;  // q/k norms: in the rope's pass where the backend fuses them
      if (arch_.qk_norm) qk = {L.q_norm.get(), L.k_norm.get(), eps};
      AttnParams ap = attn_;
      const bool sliding = cfg_.sliding_layers.size() > size_t(i) && cfg_.sliding_layers[size_t(i)];
      if (sliding) ap.window = cfg_.sliding_window;
      b.rope_kv_attention(i - r.kv_base, v.q, v.k, v.v, att, sliding && cfg_.has_local_rope ? *r.rope_local : *r.rope,
                          ap, s, qk);
    }
    if (fused) {
      // o + residual, norm + gate/up + SiLU, down + residual (experts: norm, experts + residual),
      // the next layer's norm + q/k/v
      b.linear_residual(att, *L.wo, L.bo.get(), o, x);
      if (L.moe) {
        b.rms_norm(x, *L.mlp_norm, eps, xn);
        r.moe->forward(xn, *L.moe, x, true);
      } else {
        b.rms_norm_linear_swiglu(x, *L.mlp_norm, eps, xn, *L.gate, L.b_gate.get(), *L.up, L.b_up.get(), g, u);
        b.linear_residual(u, *L.down, L.b_down.get(), o, x);
      }
      if (i + 1 < i1) {
        Backend::LinearOut next[3];
        qkv_of(layers_[size_t(i) + 1], next);
        b.rms_norm_linear_multi(x, *layers_[size_t(i) + 1].attn_norm, eps, xn, next, 3);
      }
    } else {
      if (nh > 0) b.linear(att, *L.wo, L.bo.get(), o);
      else zero(o);
      all_reduce(o);
      if (L.post_attn_norm) b.rms_norm(o, *L.post_attn_norm, eps, o);
      b.add_rms_norm(x, o, *L.mlp_norm, eps, xn);
      if (L.moe) {
        r.moe->forward(xn, *L.moe, o);
      } else if (arch_.gemma) {
        NF4FLASH_CHECK(g.data, "forward: GeGLU needs the gate buffer");
        b.linear(xn, *L.gate, L.b_gate.get(), g);
        b.linear(xn, *L.up, L.b_up.get(), u);
        b.gelu_tanh_mul(g, u, u);
        b.linear(u, *L.down, L.b_down.get(), o);
      } else {
        b.linear_swiglu(xn, *L.gate, L.b_gate.get(), *L.up, L.b_up.get(), g, u);
        b.linear(u, *L.down, L.b_down.get(), o);
      }
      all_reduce(o);
      if (L.post_mlp_norm) b.rms_norm(o, *L.post_mlp_norm, eps, o);
    }
  }
}

namespace {
// src [T, cols] on backend `from` into dst (the same shape) on backend `to`, through host memory,
// converted between the two compute dtypes (bf16/f16 to f32 exactly; f32 to 16 bits rounded to
// nearest even).
// The rows of src (on `from`) into dst (on `to`) through host staging memory of `primary`
// (pinned on CUDA), converted between the two compute dtypes.
void move_rows(Backend& from, const Act& src, Backend& to, const Act& dst, Backend& primary,
               std::unique_ptr<Buffer>& host) {
  NF4FLASH_CHECK(src.rows == dst.rows && src.cols == dst.cols, "offload: hidden state shapes differ");
  const size_t need = std::max(src.bytes(), dst.bytes()) + src.bytes();
  if (!host || host->bytes() < need) {
    host.reset();
    host = primary.alloc_host(need);
  }
  uint8_t* staged = static_cast<uint8_t*>(host->data());
  from.download(staged, src.data, src.bytes());
  if (src.dtype == dst.dtype) {
    to.upload(dst.data, staged, dst.bytes());
    return;
  }
  uint8_t* conv = staged + src.bytes();
  for (int64_t i = 0; i < src.numel(); ++i) host_store(conv, dst.dtype, i, host_load(staged, src.dtype, i));
  to.upload(dst.data, conv, dst.bytes());
}
}  // namespace

// The step's device arrays (position, or a paged step's rows, positions and block tables) copied
// to the offload backend; host arrays shared.
StepState Decoder::mirror_step(const StepState& s) {
  Offload& f = *off_;
  auto put = [&](Offload::Mirror& m, const int32_t* src, size_t n) {
    f.ints.resize(std::max<size_t>(n, 1));
    be_.download(f.ints.data(), src, n * 4);
    if (m.cap < n || !m.buf) {
      m.buf = f.be.alloc(std::max<size_t>(n, 1) * 4);
      m.cap = n;
    }
    f.be.upload(m.buf->data(), f.ints.data(), n * 4);
    return static_cast<int32_t*>(m.buf->data());
  };
  StepState t = s;
  if (s.paged) {
    const PagedSeqs& p = *s.paged;
    f.paged = p;
    f.paged.row_start = put(f.row_start, p.row_start, size_t(p.n_seqs) + 1);
    f.paged.pos0 = put(f.seq_pos0, p.pos0, size_t(p.n_seqs));
    f.paged.block_tables = put(f.tables, p.block_tables, size_t(p.n_seqs) * size_t(p.max_blocks));
    t.paged = &f.paged;
  } else {
    t.pos0 = put(f.pos0, s.pos0, 1);
  }
  return t;
}

void Decoder::forward(const int32_t* ids, int64_t T, const StepState& s, Act logits, int64_t n_logits,
                      const int32_t* logit_rows) {
  NF4FLASH_CHECK(T >= 1 && T <= max_rows_, "forward: ", T, " rows exceed the workspace of ", max_rows_);
  NF4FLASH_CHECK(n_logits >= 1 && n_logits <= T, "forward: n_logits out of range");
  ensure_workspace(T);
  const float eps = static_cast<float>(cfg_.rms_eps);
  const Views v = views(be_.act_dtype(), *b_x_, *b_xn_, *b_o_, *b_gu_, gu_cap_, T, swiglu_tmp(T));
  const Act &x = v.x, &xn = v.xn, &o = v.o;

  // Two orders of the same arithmetic, each the measured default where it runs. Prompts, dense
  // weights and the CPU: each sublayer's output o is added to the residual x by the next norm
  // (add_rms_norm: one pass). The 4-bit decode step on CUDA, where the backend folds the norm into
  // the GEMV (fuses_norm_linear): the o and down GEMVs add their output to x in their epilogue and
  // the next GEMV normalizes x in its prologue, two launches per layer fewer. Sharded or offloaded,
  // the first order: o and down are summed over the ranks before the residual add, and the hidden
  // state crosses backends whole. Not Gemma: its sublayer outputs are normed before the residual
  // add, and its MLP is GeGLU. A mixture-of-experts layer in the second order: its norm as a launch
  // of its own, the experts' weighted sum added to x by the backend (moe_experts' residual).
  const LayerWeights& L0 = layers_[0];
  const bool mlp_fuses = L0.moe ? bool(L0.moe->set) : be_.fuses_norm_linear(*L0.gate, T);
  const bool fused = !tp_.sharded() && !off_ && !arch_.gemma && be_.fuses_norm_linear(*L0.wq, T) && mlp_fuses;
  const int split = offload_first_layer();
  bool o_pending = false;  // the last sublayer's output, not yet added to x
  // the embeddings and the primary's layers
  auto head = [&](const StepState& st) {
    be_.embed(*embed_, ids, x, tp_.sharded() ? tp_.vocab.begin : -1);
    if (tp_.sharded()) all_reduce(x);  // each id's row from the rank that holds it, zeros elsewhere
    if (arch_.gemma) be_.scale(x, embed_scale_);
    run_layers({&be_, &rope_, &rope_local_, moe_block_.get(), 0}, v, 0, split, st, fused);
    o_pending = !fused && split > 0;
    if (off_ && o_pending) be_.add(x, o, x);  // the hidden state crosses whole
    if (off_) o_pending = false;
  };
  // the offloaded layers: the hidden state to the offload backend, its layers, and back
  auto offloaded = [&] {
    Offload& f = *off_;
    const Views w = views(f.be.act_dtype(), *f.x, *f.xn, *f.o, *f.gu, f.gu_cap, T, T <= f.gtmp_rows);
    move_rows(be_, x, f.be, w.x, be_, f.host);
    run_layers({&f.be, &f.rope, &f.rope_local, f.moe.get(), f.first}, w, f.first, cfg_.n_layers, mirror_step(s), false);
    f.be.add(w.x, w.o, w.x);
    move_rows(f.be, w.x, be_, x, be_, f.host);
  };
  Act last_n = xn.slice_rows(0, n_logits);
  // the final norm and lm_head
  auto tail = [&] {
    if (logit_rows) {
      // the rows that give logits, gathered (after the last residual add) into o's first rows
      if (o_pending) be_.add(x, o, x);
      Act picked = o.slice_rows(0, n_logits);
      be_.gather_rows(x, logit_rows, picked);
      be_.rms_norm(picked, *final_norm_, eps, last_n);
    } else {
      // only the rows that give logits need the last residual add and the final norm
      Act last = x.slice_rows(T - n_logits, n_logits);
      if (!o_pending) be_.rms_norm(last, *final_norm_, eps, last_n);
      else be_.add_rms_norm(last, o.slice_rows(T - n_logits, n_logits), *final_norm_, eps, last_n);
    }
    lm_head_logits(last_n, logits, n_logits);
  };
  if (off_ && step_graphs_ && T == 1 && !logit_rows && !s.paged && be_.graphs_supported()) {
    // a decode step with layers offloaded: the GPU's parts replay as two graphs (captured once
    // per workspace, KV cache, buffers and attention path), the offloaded layers run between them
    const SegmentKey key{ws_epoch_, be_.kv_epoch(), ids, logits.data, s.pos0, attn_.impl};
    if (!(key == seg_.key)) seg_ = {key, -1, -1};
    if (seg_.head < 0) {
      StepState st = s;
      st.pos0_host = -1;  // replays run at other positions
      be_.capture_begin();
      head(st);
      seg_.head = be_.capture_end();
      be_.capture_begin();
      tail();
      seg_.tail = be_.capture_end();
    }
    be_.replay(seg_.head);
    offloaded();
    be_.replay(seg_.tail);
    return;
  }
  head(s);
  if (off_) offloaded();
  tail();
}

void Decoder::lm_head_logits(Act last_n, Act logits, int64_t n_logits) {
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
