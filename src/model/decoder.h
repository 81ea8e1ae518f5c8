// The generic decoder-only transformer (Llama/Mistral/Qwen2/Qwen3 via ArchFlags), written once
// against the Backend op interface. Owns the device weights and the activation workspace.
//
// forward(): T tokens at absolute positions [pos0, pos0+T) (pos0 read from StepState memory):
//   x = embed(ids)
//   per layer: xn = rms(x); q,k,v = linear(xn) (+bias); [q/k per-head rms]; rope; kv_write;
//              attn = attention(q, cache); x += o_proj(attn);
//              xn = rms(x); x += down(silu(gate(xn)) * up(xn))
//   logits = lm_head(rms(x)) for the last `n_logits` rows, or the rows logit_rows names (F32)
// With StepState::paged the T rows belong to several sequences (a batched step over the paged
// KV cache); each row is computed as its sequence alone would compute it.
// Tensor parallel (TpShard world > 1, see model/tp_layout.h): the decoder holds one rank's shard,
// every rank runs forward() on the same ids at once, and the ranks' partial o_proj and down
// outputs are summed through the communicator; logits are gathered, so every rank returns all of
// them. The rank's backend holds the KV cache of its kv heads only (kv_heads()).
// Offload (OffloadSplit): layers [first_layer, n_layers) and their KV cache live on a second
// backend (the host's CPU backend when the primary is a GPU); the embeddings, the layers before
// them, the final norm and lm_head on the primary. A forward moves the hidden state [T, hidden] to
// that backend and back once each (through host memory, in each backend's compute dtype), and the
// step's positions and block tables with it; every row is computed as on one backend.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "io/hf_config.h"
#include "model/arch.h"
#include "model/moe.h"
#include "model/tp_layout.h"

namespace nf4flash {

class WeightStore;
struct WeightCut;

struct WeightPolicy {
  QuantType quant = QuantType::None;  // quantize dense linear weights on load to this type
  bool double_quant = false;
  int blocksize = 64;
  bool quant_lm_head = false;
  DType dense_store = DType::F32;  // storage dtype for dense weights on the backend
  bool prequantized = false;       // the checkpoint holds bitsandbytes 4-bit tensors
};

struct LayerWeights {
  std::unique_ptr<Weight> attn_norm, mlp_norm, q_norm, k_norm;
  std::unique_ptr<Weight> post_attn_norm, post_mlp_norm;  // Gemma: on the attention and MLP outputs
  std::unique_ptr<Weight> wq, wk, wv, wo, bq, bk, bv, bo;
  std::unique_ptr<Weight> gate, up, down, b_gate, b_up, b_down;  // dense MLP
  std::unique_ptr<MoeWeights> moe;                                // or a mixture of experts
};

struct DecoderStats {
  size_t weight_bytes = 0;       // resident on the backends
  size_t quant4_bytes = 0;       // of which 4-bit linear weights
  size_t offloaded_bytes = 0;    // of which on the offload backend
  int n_quant4 = 0, n_dense_linear = 0;
};

// Layers [first_layer, n_layers) on `backend`; none when backend is null (or first_layer is
// n_layers). first_layer 0 puts every layer there.
struct OffloadSplit {
  Backend* backend = nullptr;
  int first_layer = 0;
};

class Decoder {
 public:
  // Loads all weights of `store` onto `backend` (this rank's shard of them when tp.world > 1).
  // `progress(done, total)` may be null.
  Decoder(const ModelConfig& cfg, const ArchFlags& arch, Backend& backend, const WeightStore& store,
          const WeightPolicy& policy, int64_t max_rows,
          const std::function<void(int, int)>& progress = nullptr, const TpShard& tp = {},
          const OffloadSplit& offload = {});
  ~Decoder();

  // ids: backend memory, T entries (T <= max_rows). logits: F32 [n_logits, vocab] backend memory,
  // receiving the logits of the last n_logits rows, or of the rows logit_rows names.
  // logit_rows (backend memory, n_logits entries): the rows that give logits (a step over several
  // sequences: the last row of each that samples); null: the last n_logits rows.
  void forward(const int32_t* ids, int64_t T, const StepState& s, Act logits, int64_t n_logits,
               const int32_t* logit_rows = nullptr);

  const ModelConfig& config() const { return cfg_; }
  const ArchFlags& arch() const { return arch_; }
  const DecoderStats& stats() const { return stats_; }
  const TpLayout& tp_layout() const { return tp_; }
  // The kv heads this rank's KV cache holds (kv_allocate's n_kv_heads): all of them unsharded.
  int kv_heads() const { return static_cast<int>(tp_.kv_heads.n); }
  // The KV cache of every layer on the backend that runs it (d.n_layers in all: the offloaded
  // ones on the offload backend, the others on the primary), contiguous or paged.
  void kv_allocate(const KVCacheDesc& d);
  void kv_allocate_paged(const KVCacheDesc& d, int64_t n_blocks, int block_size);
  // The first offloaded layer (n_layers: none).
  int offload_first_layer() const;
  int64_t max_rows() const { return max_rows_; }
  // The activation workspace grows with the longest forward so far (from min(max_rows, 512) rows
  // up to max_rows); its epoch changes when it is reallocated (captured graphs hold its addresses),
  // the sharded decoder's buffer of its vocabulary columns of the logits included.
  int64_t workspace_rows() const { return ws_rows_; }
  int64_t workspace_epoch() const { return ws_epoch_; }
  size_t workspace_bytes(int64_t rows) const;
  struct WsLayout {
    int64_t xn_cols = 0, gu_cols = 0, row_elems = 0;
  };
  WsLayout ws_layout() const;
  // Whether linear_swiglu over T rows needs the gate buffer (the backend may do without it for
  // long prompt chunks), and the gate/up region's elements for forwards of up to `rows` rows.
  bool swiglu_tmp(int64_t T) const { return T <= gtmp_rows_; }
  int64_t gu_elems(int64_t rows) const;
  static constexpr int64_t kWsAlign = 64;  // elements: workspace views start on 128+-byte boundaries
  AttnImpl attn_impl() const { return attn_.impl; }
  void set_attn_impl(AttnImpl a) { attn_.impl = a; }
  // With layers offloaded, a decode step (one row) replays the GPU's parts (the embeddings and the
  // primary's layers; the final norm and lm_head) as two graphs where the backend has them; the
  // offloaded layers run between the two. Without offload the engine graphs the whole step.
  void set_step_graphs(bool on) { step_graphs_ = on; }
  // Kernel path names for reporting (rows = 1 for decode, many for prefill).
  std::string linear_path(int64_t rows) const;
  const Weight& lm_head() const { return lm_head_ ? *lm_head_ : *embed_; }

 private:
  void count_linear(const Weight& w);  // adds a linear weight to stats_
  std::unique_ptr<MoeWeights> moe_weights(const WeightStore& store, int layer, const WeightPolicy& p);
  std::vector<std::unique_ptr<Weight>> fused_weight(const WeightStore& store, const std::string& name,
                                                    const std::vector<int64_t>& part_rows, int64_t cols,
                                                    const WeightPolicy& p);
  std::unique_ptr<Weight> linear_weight(const WeightStore& store, const std::string& name, int64_t rows,
                                        int64_t cols, const WeightPolicy& p, bool allow_quant, const WeightCut& cut);
  // A vector of n entries, or entries [part.begin, part.end()) of it
  std::unique_ptr<Weight> vector_weight(const WeightStore& store, const std::string& name, int64_t n,
                                        const TpRange* part = nullptr);
  std::unique_ptr<Weight> optional_vector(const WeightStore& store, const std::string& name, int64_t n, bool want,
                                          const TpRange* part = nullptr);
  // The cuts of this rank's shard (none unsharded): rows or columns [r.begin * unit, r.end() * unit)
  WeightCut rows_cut(TpRange r, int64_t unit = 1) const;
  WeightCut cols_cut(TpRange r, int64_t unit = 1) const;
  void lm_head_logits(Act last_n, Act logits, int64_t n_logits);  // (gathered over the ranks) + softcap
  void all_reduce(Act a);  // sums a sublayer's partial output over the ranks (nothing unsharded)
  void zero(Act a);        // a rank holding no q heads adds zeros to the attention's sum
  static std::string layer_name(int i, const char* suffix);

  // The activations of one forward on one backend (views of its workspace, see ws_layout).
  struct Views {
    Act x, xn, o, att, q, k, v, g, u;
  };
  // gtmp: linear_swiglu over T rows takes the gate buffer (swiglu_tmp)
  Views views(DType adt, Buffer& x, Buffer& xn, Buffer& o, Buffer& gu, int64_t gu_cap, int64_t T, bool gtmp) const;
  // Layers [i0, i1) on backend b; the residual x is whole at i0 (its norm has no pending add).
  // KV layer i of the model is layer i - kv_base of b's cache. Returns with the last sublayer's
  // output o still to be added to x unless fused.
  struct LayerRun {
    Backend* be;
    const RopeParams* rope;
    const RopeParams* rope_local;
    MoeBlock* moe;
    int kv_base;
  };
  void run_layers(const LayerRun& r, const Views& v, int i0, int i1, const StepState& s, bool fused);
  // The largest row count whose linear_swiglu needs the gate buffer, for layers [i0, i1) on b.
  int64_t gate_tmp_rows(Backend& b, int i0, int i1) const;
  StepState mirror_step(const StepState& s);  // the step's device arrays on the offload backend
  std::pair<KVCacheDesc, KVCacheDesc> kv_split(const KVCacheDesc& d) const;
  struct Offload;
  std::unique_ptr<Offload> off_;
  // the offloaded decode step's two graphs and what their captures hold
  struct SegmentKey {
    int64_t ws_epoch = -1, kv_epoch = -1;
    const void *ids = nullptr, *logits = nullptr, *pos0 = nullptr;
    AttnImpl attn = AttnImpl::Auto;
    bool operator==(const SegmentKey&) const = default;
  };
  struct {
    SegmentKey key;
    int head = -1, tail = -1;
  } seg_;
  bool step_graphs_ = false;
  Backend* cur_ = nullptr;  // the backend the weights being loaded go to

  ModelConfig cfg_;
  ArchFlags arch_;
  TpShard shard_;
  TpLayout tp_;
  ModelConfig moe_cfg_;  // cfg_ with this rank's expert widths, for moe_block_
  Backend& be_;
  int64_t max_rows_;
  int64_t ws_rows_ = 0, ws_epoch_ = 0;
  int64_t gu_cap_ = 0;     // elements of b_gu_
  int64_t gtmp_rows_ = 0;  // the largest row count (<= max_rows_) whose linear_swiglu needs the gate buffer
  void ensure_workspace(int64_t rows);
  std::unique_ptr<Weight> embed_, final_norm_, lm_head_;
  std::vector<LayerWeights> layers_;
  std::unique_ptr<Buffer> inv_freq_buf_, inv_freq_long_buf_, inv_freq_local_buf_;
  RopeParams rope_local_;  // Gemma 3's sliding layers
  float embed_scale_ = 1.0f;  // Gemma: sqrt(hidden) in the compute dtype, as transformers casts it
  std::unique_ptr<MoeBlock> moe_block_;  // MoE models
  RopeParams rope_;
  AttnParams attn_;
  DecoderStats stats_;
  DType policy_store_ = DType::F32;
  // workspace
  std::unique_ptr<Buffer> b_x_, b_xn_, b_o_, b_gu_;  // views in forward(); see ws_row_elems
  std::unique_ptr<Buffer> b_logits_;                  // sharded: this rank's vocabulary columns
  std::vector<uint8_t> zeros_;
};

}  // namespace nf4flash
