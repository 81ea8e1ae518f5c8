// The narrow op interface between the generic decoder and a compute device (CPU or CUDA).
// Model code never branches on the device or on the weight format: a weight is an opaque
// `Weight` (dense bf16/f16/f32, or bitsandbytes 4-bit) and every op takes `Act` views.
//
// Conventions (all backends):
//  * Act: non-owning row-major 2-D view [rows, cols] of backend memory, dtype = backend act dtype
//    (CPU: F32 always; CUDA: the compute dtype) unless an op says otherwise (logits may be F32).
//  * Ops are ordered: on CUDA they are queued on the backend's stream (asynchronous, capturable
//    into a CUDA graph); sync() waits for them.
//  * Positions come from device memory (`StepState`), so a captured decode step replays for
//    every token without re-recording: query row t of a step has absolute position pos0 + t.
//  * KV cache layout: K and V each [n_layers][n_kv_heads][capacity][head_dim], dtype kv_dtype.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda_tuning.h"
#include "core/dtype.h"
#include "core/error.h"
#include "nf4flash/options.h"
#include "quant/quant4.h"

namespace nf4flash {

struct TensorInfo;

enum class Device : uint8_t { CPU, CUDA };
enum class AttnImpl : uint8_t { Auto, Flash, Sdpa, Eager };
std::string_view attn_impl_name(AttnImpl a);

struct Act {
  void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;

  int64_t numel() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  // The same memory seen as [rows*cols/new_cols, new_cols] (e.g. per-head views).
  Act reshaped(int64_t new_cols) const { return Act{data, dtype, numel() / new_cols, new_cols}; }
  // Rows [r0, r0+n) of this view.
  Act slice_rows(int64_t r0, int64_t n) const {
    return Act{static_cast<char*>(data) + static_cast<size_t>(r0 * cols) * dtype_size(dtype), dtype, n, cols};
  }
};

// Memory owned by a backend (freed with it). Stable address: safe to capture in graphs.
class Buffer {
 public:
  virtual ~Buffer() = default;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Act as_act(DType t, int64_t rows, int64_t cols) const { return Act{data_, t, rows, cols}; }

 protected:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Plain host memory (Backend::alloc_host where the backend needs nothing else).
class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : mem_(bytes) {
    bytes_ = bytes;
    data_ = mem_.data();
  }

 private:
  std::vector<uint8_t> mem_;
};

// A weight resident on a backend: a linear weight [out_features, in_features], an embedding
// table [vocab, hidden] (also usable as a tied lm_head), or a vector (norm weight, bias).
class Weight {
 public:
  enum class Kind : uint8_t { Dense, Quant4 };
  virtual ~Weight() = default;
  Kind kind() const { return kind_; }
  DType dtype() const { return dtype_; }  // storage dtype for Dense; orig dtype for Quant4
  QuantType quant() const { return quant_; }
  bool double_quant() const { return double_quant_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  size_t resident_bytes() const { return bytes_; }

 protected:
  Kind kind_ = Kind::Dense;
  DType dtype_ = DType::F32;
  QuantType quant_ = QuantType::None;
  bool double_quant_ = false;
  int64_t rows_ = 0, cols_ = 0;
  size_t bytes_ = 0;
};

struct RopeParams {
  int head_dim = 0;         // rotary dims = head_dim (rotate-half layout, as transformers)
  const float* inv_freq = nullptr;  // backend memory, head_dim/2 floats (scaling already applied)
  // longrope (CPU backend): rows of a sequence whose forward ends past long_after positions use
  // inv_freq_long; cos and sin are multiplied by mscale. Null / 1: plain RoPE.
  const float* inv_freq_long = nullptr;
  int64_t long_after = 0;
  float mscale = 1.0f;
  // dynamic NTK: rows of a sequence whose forward ends at L > dynamic_after use the table
  // dynamic_table(L) writes (head_dim / 2 floats, host memory: the CPU backend), the same values
  // as transformers computes them from theta and factor (CUDA computes them per row on the device:
  // inv_freq[i] = 1 / base^(2i / head_dim), base = dynamic_theta * (factor L / dynamic_after -
  // (factor - 1))^(head_dim / (head_dim - 2)), in f32).
  int64_t dynamic_after = 0;
  std::function<void(int64_t, float*)> dynamic_table;
  float dynamic_theta = 0.0f, dynamic_factor = 1.0f;
};

struct AttnParams {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  AttnImpl impl = AttnImpl::Auto;
  // CPU backend (Gemma): scores soft-capped as tanh(s / softcap) * softcap (0: none); a query at
  // position p sees keys (p - window, p] (0: all earlier ones)
  float softcap = 0.0f;
  int64_t window = 0;
};

// A step over several sequences whose K/V live in a paged cache (kv_allocate_paged): the rows of
// sequence i are [row_start[i], row_start[i+1]), at positions pos0[i], pos0[i] + 1, ...; position
// p of sequence i is slot p % block_size of block block_tables[i * max_blocks + p / block_size].
// Arrays in backend memory (the runtime writes them before the step); n_seqs and max_blocks on the
// host. Rows of one sequence are computed exactly as that sequence alone would compute them.
struct PagedSeqs {
  int n_seqs = 0;
  const int32_t* row_start = nullptr;     // [n_seqs + 1]
  const int32_t* pos0 = nullptr;          // [n_seqs]
  const int32_t* block_tables = nullptr;  // [n_seqs][max_blocks]
  int max_blocks = 0;
  // The same row_start and pos0 in host memory (a backend sizes work from them: CUDA computes the
  // rows of a sequence with many rows, a prompt chunk, with its prompt kernels).
  const int32_t* row_start_host = nullptr;
  const int32_t* pos0_host = nullptr;
};

// Per-head RMS norms of q and k ahead of rope (rope_kv_write): weights of head_dim values, or none.
struct QkNorm {
  const Weight* q = nullptr;
  const Weight* k = nullptr;
  float eps = 0.f;
};

// Device-resident per-step values read by the ops (written by the runtime before each step).
struct StepState {
  int32_t* pos0 = nullptr;  // backend memory: absolute position of row 0 of the step
  // The same position when the host knows it for this step (prefill chunks, uncaptured decode);
  // -1 while a graph is being captured (replays change pos0 in device memory only). Ops may use
  // it to size work on the host (eager CUDA attention: key length pos0_host + T).
  int64_t pos0_host = -1;
  // Several sequences over the paged cache (pos0 and pos0_host unused then); null: one sequence at
  // pos0 over the contiguous cache.
  const PagedSeqs* paged = nullptr;
};

struct KVCacheDesc {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  int64_t capacity = 0;  // tokens
  DType dtype = DType::F32;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;     // e.g. "cpu (16 threads, avx2)"
  virtual DType act_dtype() const = 0;

  // ---- memory -------------------------------------------------------------------------------
  virtual std::unique_ptr<Buffer> alloc(size_t bytes) = 0;
  // Host memory for staging copies to and from this backend (CUDA: pinned, so that upload and
  // download run at the link's rate).
  virtual std::unique_ptr<Buffer> alloc_host(size_t bytes) { return std::make_unique<HostBuffer>(bytes); }
  // host -> backend, ordered after every op queued before it (the host buffer may be reused
  // as soon as it returns)
  virtual void upload(void* dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const void* src, size_t bytes) = 0;  // backend -> host (syncs)
  virtual void sync() = 0;
  // The stream (cudaStream_t) this backend's ops run on, for libraries that join it (NCCL); null
  // where there is none.
  virtual void* native_stream() const { return nullptr; }
  // Memory still free for the KV cache and workspace (bytes; 0 = unknown).
  virtual size_t free_memory() const { return 0; }

  // ---- weights ------------------------------------------------------------------------------
  // A dense tensor from a checkpoint (bf16/f16/f32), stored as `store` dtype on the backend.
  // 1-D tensors become [1, n].
  virtual std::unique_ptr<Weight> upload_dense(const TensorInfo& t, DType store) = 0;
  virtual std::unique_ptr<Weight> upload_quant4(std::shared_ptr<const Quant4Tensor> q) = 0;
  // The token embedding table (only embed() reads it unless `tied`: then it is the lm_head too).
  // CUDA keeps an untied table in pinned host memory (as llama.cpp does): a step gathers T rows.
  virtual std::unique_ptr<Weight> upload_embedding(const TensorInfo& t, DType store, bool tied) {
    return upload_dense(t, store);
  }

  // ---- ops ----------------------------------------------------------------------------------
  // out[t, :] = table[ids[t], :]           ids: backend memory, out.rows of them
  // shard_row0 >= 0: the table holds vocabulary rows [shard_row0, shard_row0 + its rows) (a
  // tensor-parallel rank's shard); ids outside them give zero rows.
  virtual void embed(const Weight& table, const int32_t* ids, Act out, int64_t shard_row0 = -1) = 0;
  // out[r, :] = x[r, :] / sqrt(mean(x[r,:]^2) + eps) * w     (x may alias out; w has x.cols entries)
  virtual void rms_norm(Act x, const Weight& w, float eps, Act out) = 0;
  // out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]); out.dtype may be F32 (logits) or act dtype
  virtual void linear(Act x, const Weight& w, const Weight* bias, Act out) = 0;
  // In-place rotary embedding of q [T, n_heads*hd] and k [T, n_kv*hd] at positions pos0 + t.
  virtual void rope(Act q, Act k, const RopeParams& p, const StepState& s) = 0;
  // Write k, v [T, n_kv*hd] into the cache of `layer` at positions pos0 + t.
  virtual void kv_write(int layer, Act k, Act v, const StepState& s) = 0;
  // Causal attention of q [T, n_heads*hd] over cache positions [0, pos0 + t] -> out [T, n_heads*hd].
  virtual void attention(int layer, Act q, Act out, const AttnParams& p, const StepState& s) = 0;
  // out = silu(gate) * up
  virtual void silu_mul(Act gate, Act up, Act out) = 0;
  // Gemma's ops (the CPU backend so far): out = gelu_tanh(gate) * up; x *= s; x = tanh(x / c) * c
  virtual void gelu_tanh_mul(Act gate, Act up, Act out) { unsupported("gelu_tanh_mul"); }
  virtual void scale(Act x, float s) { unsupported("scale"); }
  virtual void softcap(Act x, float c) { unsupported("softcap"); }
  // out = a + b (out may alias a)
  virtual void add(Act a, Act b, Act out) = 0;

  // ---- fused ops: the defaults compose the primitives above; a backend overrides what it fuses ----
  struct LinearOut {
    const Weight* w = nullptr;
    const Weight* bias = nullptr;
    Act out;
  };
  // outs[i].out = x W_i^T + b_i for n (<= 3) weights sharing in_features (q, k and v).
  virtual void linear_multi(Act x, const LinearOut* outs, int n) {
    for (int i = 0; i < n; ++i) linear(x, *outs[i].w, outs[i].bias, outs[i].out);
  }
  // outs[i].out = xs[i] W_i^T + b_i for n independent products (a mixture's experts), each with
  // its own rows; a backend may run them as one parallel launch.
  virtual void linear_group(const Act* xs, const LinearOut* outs, int n) {
    for (int i = 0; i < n; ++i) linear(xs[i], *outs[i].w, outs[i].bias, outs[i].out);
  }
  // resid += x W^T + b (the sum rounded as add() rounds it); tmp: scratch [x.rows, W.rows].
  virtual void linear_residual(Act x, const Weight& w, const Weight* bias, Act tmp, Act resid) {
    linear(x, w, bias, tmp);
    add(resid, tmp, resid);
  }
  // x += delta (rounded as add() rounds), then out = rms_norm(x): one sublayer's residual add and
  // the next one's norm.
  virtual void add_rms_norm(Act x, Act delta, const Weight& w, float eps, Act out) {
    add(x, delta, x);
    rms_norm(x, w, eps, out);
  }
  // out = silu(x G^T + bg) * (x U^T + bu); g_tmp: scratch of out's shape, or empty (data null)
  // where linear_swiglu_needs_tmp says the backend does without it.
  virtual bool linear_swiglu_needs_tmp(const Weight& /*gate*/, const Weight& /*up*/, int64_t /*rows*/,
                                       bool /*bias*/) const {
    return true;
  }
  virtual void linear_swiglu(Act x, const Weight& gate, const Weight* bg, const Weight& up, const Weight* bu,
                             Act g_tmp, Act out) {
    linear(x, gate, bg, g_tmp);
    linear(x, up, bu, out);
    silu_mul(g_tmp, out, out);
  }
  // The decode-step fusions of the norm into the next linear: outs = linear_multi(rms_norm(x)) and
  // out = linear_swiglu(rms_norm(x)); xn: scratch of x's shape for the normalized rows (a backend
  // that folds the norm into the GEMV leaves it unwritten). Results are those of the unfused ops.
  virtual void rms_norm_linear_multi(Act x, const Weight& norm_w, float eps, Act xn, const LinearOut* outs, int n) {
    rms_norm(x, norm_w, eps, xn);
    linear_multi(xn, outs, n);
  }
  virtual void rms_norm_linear_swiglu(Act x, const Weight& norm_w, float eps, Act xn, const Weight& gate,
                                      const Weight* bg, const Weight& up, const Weight* bu, Act g_tmp, Act out) {
    rms_norm(x, norm_w, eps, xn);
    linear_swiglu(xn, gate, bg, up, bu, g_tmp, out);
  }
  // Whether rms_norm_*_linear_* with weight w at `rows` rows runs as one fused launch (and
  // linear_residual fuses its add): the decoder then orders a layer as norm+linear, residual-adding
  // linears (the 4-bit decode step on CUDA); otherwise as add_rms_norm + linear (one pass for the
  // add and the next norm).
  virtual bool fuses_norm_linear(const Weight& w, int64_t rows) const { return false; }
  // With qk.q set: q and k first normed per head in place (rms_norm of each head_dim slice with
  // weights qk.q, qk.k: Qwen3's and Gemma 3's q/k norms); then rope(q, k) and kv_write(layer, k, v).
  virtual void rope_kv_write(int layer, Act q, Act k, Act v, const RopeParams& p, const StepState& s,
                             const QkNorm& qk = {}) {
    if (qk.q) qk_norm(q, k, p.head_dim, qk);
    rope(q, k, p, s);
    kv_write(layer, k, v, s);
  }

  // rope_kv_write(layer, q, k, v, qk) then attention(layer, q, out): one decode layer's attention.
  // A backend that fuses them may leave q and k unrotated (nothing reads them after).
  virtual void rope_kv_attention(int layer, Act q, Act k, Act v, Act out, const RopeParams& rp, const AttnParams& ap,
                                 const StepState& s, const QkNorm& qk = {}) {
    rope_kv_write(layer, q, k, v, rp, s, qk);
    attention(layer, q, out, ap, s);
  }

  // ---- mixture of experts (MoeBlock) ----------------------------------------------------------
  // A layer's experts bundled for moe_experts (each backend's own form), made once at load.
  class ExpertSet {
   public:
    virtual ~ExpertSet() = default;
  };
  struct ExpertRefs {
    const Weight *gate = nullptr, *up = nullptr, *down = nullptr;
  };
  // The experts as one set that moe_experts reads by expert id, or null where the backend runs a
  // mixture through MoeBlock's host routing and linear_group (the CPU backend).
  virtual std::unique_ptr<ExpertSet> make_expert_set(const std::vector<ExpertRefs>& experts) { return nullptr; }
  // Backend memory moe_experts needs for `rows` rows routed to top_k experts each (bytes).
  virtual size_t moe_scratch_bytes(const ExpertSet& set, int64_t rows, int top_k) const {
    unsupported("moe_scratch_bytes");
  }
  // Routing and experts on the backend, for x [T, hidden] (the normed rows) and the router's
  // logits [T, n_experts] (f32): p = softmax(logits[t]); the top_k experts of row t (ties: the
  // lower index), p renormalized over them when norm_topk;
  //   out[t] = sum over those experts e, in ascending e, p_e * down_e(silu(gate_e x[t]) * up_e x[t])
  //            (+ sigmoid(shared_logit[t]) * shared[t] where shared.data: a shared expert's output
  //            [T, hidden] and its gate's logit [T, 1] f32).
  // residual: out += that sum instead (rounded to the compute dtype, then added as add() adds).
  // scratch: moe_scratch_bytes(set, T, top_k) bytes of backend memory.
  virtual void moe_experts(Act x, Act logits, const ExpertSet& set, int top_k, bool norm_topk, Act shared,
                           Act shared_logit, void* scratch, Act out, bool residual = false) {
    unsupported("moe_experts");
  }

  // ---- KV cache -----------------------------------------------------------------------------
  virtual void kv_allocate(const KVCacheDesc& d) = 0;
  // The paged cache instead: n_blocks blocks of block_size positions, each holding every layer's K
  // and V of those positions (d.capacity unused). Steps then pass StepState::paged.
  virtual void kv_allocate_paged(const KVCacheDesc& d, int64_t n_blocks, int block_size) {
    fail("the paged KV cache (batched sequences) is not supported by the ", name(), " backend yet");
  }
  // out[i, :] = x[rows[i], :] for i < out.rows (rows: backend memory); the rows that give logits
  // in a step over several sequences.
  virtual void gather_rows(Act x, const int32_t* rows, Act out) {
    fail("gather_rows (batched sequences) is not supported by the ", name(), " backend yet");
  }
  virtual const KVCacheDesc& kv_desc() const = 0;
  // Changes whenever the KV cache is allocated again (kv_allocate, kv_allocate_paged): a captured
  // step holds the cache's addresses and is valid only for the epoch it was captured in.
  int64_t kv_epoch() const { return kv_epoch_; }
  // Changes whenever a workspace the backend keeps for its ops (attention splits, the 4-bit GEMMs'
  // split slices, dequantize scratch, ...) is allocated again for a larger step: a captured step
  // holds their addresses too.
  int64_t scratch_epoch() const { return scratch_epoch_; }
  virtual size_t kv_bytes() const = 0;

  // Which attention implementations can serve this request; empty string = yes, else why not.
  virtual std::string attn_unsupported_reason(AttnImpl impl, int head_dim) const = 0;
  // Human-readable name of the attention path `impl` (resolved, not Auto) takes for prompts.
  virtual std::string attn_path(AttnImpl impl) const { return std::string(attn_impl_name(impl)); }
  // Human-readable name of the kernel path a linear on `w` with `rows` rows takes.
  virtual std::string linear_path(const Weight& w, int64_t rows) const = 0;

  // ---- step graphs (CUDA graphs; CPU: unsupported) ------------------------------------------
  // Ops issued between capture_begin() and capture_end() are recorded, not run; replay(id)
  // runs them again with the same buffers (positions are re-read from StepState memory).
  virtual bool graphs_supported() const { return false; }
  virtual void capture_begin() {}
  virtual int capture_end() { return -1; }
  virtual void replay(int graph_id) {}

  // ---- sampling on the device (optional) ----------------------------------------------------
  // Picks the next token from logits [1, vocab] (F32) with `p`; `history` (HOST memory, n_history
  // ids: prompt + generated) feeds the repetition penalty; `uniform` is the step's random number in
  // [0,1) (ignored when greedy). The id must equal sample_with_uniform(logits, p, history, uniform)
  // (sampling/sampler.h). Returns false when the backend leaves sampling to the host.
  virtual bool sample(Act logits, const SamplingParams& p, const int32_t* history, int n_history,
                      float uniform, int32_t* out_id_host) { return false; }

  // One token per row of logits [n, vocab] (F32), row i picked as sample() picks it with params[i],
  // the history histories[i] (host ids: prompt + generated) and uniforms[i], all rows in one round
  // trip; ids to out_ids_host[n]. Returns false when the backend leaves sampling to the host.
  virtual bool sample_rows(Act logits, const SamplingParams* params, const std::vector<int32_t>* const* histories,
                           const float* uniforms, int32_t* out_ids_host) { return false; }

  // ---- pipelined decode (optional) ----------------------------------------------------------
  // The decode loop without a host round trip per token: sample_to_device() picks the id as
  // sample() does, queued in order with the ops, and writes it to `next_id` (backend memory: the
  // next step's input id), advances `*pos` (backend memory: the next step's position) by one and
  // copies the id to host slot `slot` (< kSampleSlots); sampled(slot) waits for that copy and
  // returns the id. So the step after it can be queued before its input id reaches the host. The
  // repetition penalty's history is in backend memory too: `history` holds `*history_count` ids
  // (capacity `history_capacity`) and the chosen id is appended to it. Returns false when the
  // backend does not do this (the engine then samples each step with sample()).
  static constexpr int kSampleSlots = 4;
  virtual bool sample_to_device(Act logits, const SamplingParams& p, float uniform, int32_t* next_id, int32_t* pos,
                                int slot, int32_t* history = nullptr, int32_t* history_count = nullptr,
                                int history_capacity = 0) { return false; }
  virtual int32_t sampled(int slot) { fail("sampled: this backend does not pipeline decode"); }
  // Whether the engine pipelines decode by default: true where the steps run asynchronously to
  // the host (CUDA); a CPU step runs inside the call, so queuing one ahead only adds a step
  // computed in vain when generation stops (the engine may still be told to, for its tests).
  virtual bool pipelines_decode() const { return false; }

 protected:
  [[noreturn]] void unsupported(const char* op) const { fail(op, ": not supported on the ", name(), " backend"); }
  // q and k normed per head in place: rms_norm of each head_dim slice with weights qk.q, qk.k.
  void qk_norm(Act q, Act k, int head_dim, const QkNorm& qk) {
    NF4FLASH_CHECK(qk.q && qk.k, "q/k norms: both weights are needed");
    rms_norm(q.reshaped(head_dim), *qk.q, qk.eps, q.reshaped(head_dim));
    rms_norm(k.reshaped(head_dim), *qk.k, qk.eps, k.reshaped(head_dim));
  }
  int64_t kv_epoch_ = 0;  // incremented by every kv_allocate
  mutable int64_t scratch_epoch_ = 0;  // incremented whenever an op workspace is allocated again (const ops grow them too)
};

struct CpuBackendOptions {
  DType compute = DType::F32;  // F32, or BF16: bf16 weights (4-bit dequantized to bf16), f32 math
  int threads = 0;             // 0: all cores
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& o);

struct CudaBackendOptions {
  DType compute = DType::BF16;
  int device_index = 0;
  bool tf32 = false;
  // unset: cuda_tuning_current() (the scoped override of the tests, else the environment)
  std::optional<CudaTuning> tuning;
};
// Throws Error when built without CUDA or when no device is usable.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& o);
// Number of usable CUDA devices (0 when built without CUDA or no driver); never throws.
int cuda_device_count();

}  // namespace nf4flash
