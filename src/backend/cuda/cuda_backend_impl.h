// The CUDA Backend class: one device, one non-blocking stream, plain cudaMalloc per buffer, cuBLAS
// for many-row products, CUDA graphs over the stream. Every CUDA/cuBLAS call is checked with
// file:line. Its members are defined in:
//   cuda_backend.cu    construction from CudaTuning, memory, graphs, sampling, the factory
//   cuda_weights.cu    uploads (dense, embedding in pinned host memory, 4-bit repacked on the GPU)
//   cuda_linear.cu     LinearPlan: which kernel a linear takes, and linear() with its fused forms
//   cuda_attention.cu  rope, KV cache, attention (decode, flash, sdpa, eager)
//   cuda_paged.cu      the paged KV cache and steps over several sequences (attention, row gather,
//                      sampling of many rows)
//   cuda_moe.cu        mixture of experts: a layer's experts as device tables, routing on the GPU
// Buffers and the weight types live in cuda_resources.h.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attn_eager.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_resources.h"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda_impl {

using namespace cuda;

// The kernel path of a linear product, decided in one place (CudaBackend::plan) from the weight's
// format and the row count; the dispatch and the reported path (linear_path) both come from it.
enum class LinearPlan : uint8_t {
  Q4Decode,       // 4-bit, 1..8 rows: gemv_q4_decode (q/k/v, gate+up+SiLU, residual and norm fused)
  Q4Gemv,         // 4-bit, 9..gemv_max_rows rows: gemv_q4 in launches of 8 rows
  Q4Skinny,       // 4-bit, auto mode, up to q4_skinny_max_rows_ rows: the skinny GEMM (mma.sync; q/k/v and
                  // gate+up one launch each)
  Q4FusedGemm,    // 4-bit, up to q4_fused_max_rows rows: the fused wgmma GEMM (sm_90a)
  Q4DequantGemm,  // 4-bit, more rows (or f32 compute): dequantize (in row chunks) + cublasGemmEx
  DenseGemv,      // dense (and 4-bit dequantized at load), 1..8 rows: gemv_dense / gemv_dense_multi
  DenseGemm,      // dense, more rows: cublasGemmEx
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o);
  ~CudaBackend() override;

  Device device() const override { return Device::CUDA; }
  std::string name() const override {
    return cat("cuda (", props_.name, ", sm_", props_.major, props_.minor, ", ", props_.multiProcessorCount,
               " SMs, ", dtype_name(act_), ")");
  }
  DType act_dtype() const override { return act_; }
  const CudaTuning& tuning() const { return tuning_; }

  // ---- memory (cuda_backend.cu) ----
  std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<CudaBuffer>(bytes); }
  std::unique_ptr<Buffer> alloc_host(size_t bytes) override { return std::make_unique<CudaHostBuffer>(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override;
  void download(void* dst, const void* src, size_t bytes) override;
  void sync() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void* native_stream() const override { return stream_; }
  size_t free_memory() const override;

  // ---- weights (cuda_weights.cu) ----
  std::unique_ptr<Weight> upload_dense(const TensorInfo& t, DType store) override;
  std::unique_ptr<Weight> upload_embedding(const TensorInfo& t, DType store, bool tied) override;
  std::unique_ptr<Weight> upload_quant4(std::shared_ptr<const Quant4Tensor> qp) override;

  // ---- elementwise ops ----
  void embed(const Weight& table, const int32_t* ids, Act out, int64_t shard_row0) override {
    const CudaDense& t = as_dense(table, "embed");
    check_act(out, "embed");
    NF4FLASH_CHECK(out.cols == t.cols(), "embed: hidden ", out.cols, " != table cols ", t.cols());
    cuda::embed(t.data->data(), t.dtype(), t.rows(), t.cols(), ids, out.rows, out.data, act_, stream_, shard_row0);
  }
  void rms_norm(Act x, const Weight& w, float eps, Act out) override {
    check_act(x, "rms_norm");
    check_act(out, "rms_norm");
    NF4FLASH_CHECK(x.rows == out.rows && x.cols == out.cols, "rms_norm: shape mismatch");
    cuda::rms_norm(x.data, vec_f32(w, x.cols, "rms_norm weight"), eps, x.rows, x.cols, out.data, act_, stream_);
  }
  void add_rms_norm(Act x, Act delta, const Weight& w, float eps, Act out) override {
    check_act(x, "add_rms_norm");
    check_act(delta, "add_rms_norm");
    check_act(out, "add_rms_norm");
    NF4FLASH_CHECK(x.rows == out.rows && x.cols == out.cols && delta.rows == x.rows && delta.cols == x.cols,
                   "add_rms_norm: shape mismatch");
    cuda::add_rms_norm(x.data, delta.data, vec_f32(w, x.cols, "rms_norm weight"), eps, x.rows, x.cols, out.data,
                       act_, stream_);
  }
  void silu_mul(Act gate, Act up, Act out) override {
    check_gated(gate, up, out, "silu_mul");
    cuda::silu_mul(gate.data, up.data, out.data, gate.numel(), act_, stream_);
  }
  void gelu_tanh_mul(Act gate, Act up, Act out) override {
    check_gated(gate, up, out, "gelu_tanh_mul");
    cuda::gelu_tanh_mul(gate.data, up.data, out.data, gate.numel(), act_, stream_);
  }
  // x in the compute dtype, or F32 (the logits)
  void scale(Act x, float s) override {
    NF4FLASH_CHECK(x.dtype == act_ || x.dtype == DType::F32, "scale: dtype ", dtype_name(x.dtype));
    cuda::scale(x.data, s, false, x.numel(), x.dtype, stream_);
  }
  void softcap(Act x, float c) override {
    NF4FLASH_CHECK(x.dtype == act_ || x.dtype == DType::F32, "softcap: dtype ", dtype_name(x.dtype));
    NF4FLASH_CHECK(c > 0, "softcap: cap ", c, " must be positive");
    cuda::scale(x.data, c, true, x.numel(), x.dtype, stream_);
  }
  void add(Act a, Act b, Act out) override {
    check_act(a, "add");
    check_act(b, "add");
    check_act(out, "add");
    NF4FLASH_CHECK(a.numel() == b.numel() && out.numel() == a.numel(), "add: size mismatch");
    cuda::add(a.data, b.data, out.data, a.numel(), act_, stream_);
  }

  // ---- linear products (cuda_linear.cu) ----
  LinearPlan plan(const Weight& w, int64_t rows) const;
  void linear(Act x, const Weight& w, const Weight* bias, Act out) override;
  void linear_multi(Act x, const LinearOut* outs, int n) override;
  void rms_norm_linear_multi(Act x, const Weight& norm_w, float eps, Act xn, const LinearOut* outs, int n) override;
  void rms_norm_linear_swiglu(Act x, const Weight& norm_w, float eps, Act xn, const Weight& gate, const Weight* bg,
                              const Weight& up, const Weight* bu, Act g_tmp, Act out) override;
  bool fuses_norm_linear(const Weight& w, int64_t rows) const override;
  void linear_residual(Act x, const Weight& w, const Weight* bias, Act tmp, Act resid) override;
  void linear_swiglu(Act x, const Weight& gate, const Weight* bg, const Weight& up, const Weight* bu, Act g_tmp,
                     Act out) override;
  bool linear_swiglu_needs_tmp(const Weight& gate, const Weight& up, int64_t rows, bool bias) const override;
  std::string linear_path(const Weight& w, int64_t rows) const override;

  // ---- mixture of experts (cuda_moe.cu) ----
  std::unique_ptr<ExpertSet> make_expert_set(const std::vector<ExpertRefs>& experts) override;
  size_t moe_scratch_bytes(const ExpertSet& set, int64_t rows, int top_k) const override;
  void moe_experts(Act x, Act logits, const ExpertSet& set, int top_k, bool norm_topk, Act shared, Act shared_logit,
                   void* scratch, Act out, bool residual = false) override;
  // ---- rope, KV cache, attention (cuda_attention.cu) ----
  void rope(Act q, Act k, const RopeParams& p, const StepState& s) override;
  void kv_write(int layer, Act k, Act v, const StepState& s) override;
  void rope_kv_write(int layer, Act q, Act k, Act v, const RopeParams& p, const StepState& s,
                     const QkNorm& qk = {}) override;
  void attention(int layer, Act q, Act out, const AttnParams& p, const StepState& s) override;
  void kv_allocate(const KVCacheDesc& d) override;
  // ---- paged steps (cuda_paged.cu) ----
  void kv_allocate_paged(const KVCacheDesc& d, int64_t n_blocks, int block_size) override;
  void gather_rows(Act x, const int32_t* rows, Act out) override;
  bool sample_rows(Act logits, const SamplingParams* params, const std::vector<int32_t>* const* histories,
                   const float* uniforms, int32_t* out_ids_host) override;
  const KVCacheDesc& kv_desc() const override { return kv_; }
  size_t kv_bytes() const override { return (k_cache_ ? k_cache_->bytes() : 0) + (v_cache_ ? v_cache_->bytes() : 0); }
  std::string attn_unsupported_reason(AttnImpl impl, int head_dim) const override;
  std::string attn_path(AttnImpl impl) const override;

  // ---- graphs (cuda_backend.cu) ----
  bool graphs_supported() const override { return true; }
  void capture_begin() override;
  int capture_end() override;
  void replay(int id) override;

  // ---- sampling (cuda_backend.cu) ----
  // Every parameter set runs on the device (kernels/sample.cuh, kernels/sample_topk.cuh); only the
  // history ids go up (when the penalty is on) and the 4-byte id comes back.
  bool sample(Act logits, const SamplingParams& p, const int32_t* history, int n_history, float uniform,
              int32_t* out_id_host) override;
  bool sample_to_device(Act logits, const SamplingParams& p, float uniform, int32_t* next_id, int32_t* pos,
                        int slot, int32_t* history, int32_t* history_count, int history_capacity) override;
  int32_t sampled(int slot) override;
  bool pipelines_decode() const override { return true; }

 private:
  void check_act(const Act& a, const char* what) const {
    NF4FLASH_CHECK(a.dtype == act_, what, ": activation dtype ", dtype_name(a.dtype), " != backend compute dtype ",
                   dtype_name(act_));
  }
  // a gated activation's operands: the compute dtype, one size
  void check_gated(const Act& gate, const Act& up, const Act& out, const char* what) const {
    check_act(gate, what);
    check_act(up, what);
    check_act(out, what);
    NF4FLASH_CHECK(gate.numel() == up.numel() && out.numel() == gate.numel(), what, ": size mismatch");
  }
  // An op workspace allocated again at `bytes` (the old one freed first); a captured step holding
  // the old address captures again (scratch_epoch).
  void renew_workspace(std::unique_ptr<CudaBuffer>& b, size_t bytes) const {
    b.reset();
    b = std::make_unique<CudaBuffer>(bytes);
    ++scratch_epoch_;
  }
  void reserve_scratch(int64_t numel) {
    const size_t need = size_t(numel) * dtype_size(act_);
    if (!scratch_ || scratch_->bytes() < need) renew_workspace(scratch_, need);
  }

  // ---- linear helpers (cuda_linear.cu) ----
  void check_linear(const Act& x, const Weight& w, const Act& out) const;
  // The 4-bit weight of w when it is kept in the tiled layout (not dequantized at load), else null.
  static const CudaQ4* tiled_q4(const Weight& w);
  // same quantization (and, with cols, the same in_features: weights sharing one x)
  static bool same_q4_params(const CudaQ4& a, const CudaQ4& b, bool cols = true);
  // out[:, n0 : n0+N] = x[T, K] * W[N, K]^T; out has out.cols columns (the leading dimension).
  void gemm(const void* w, int64_t N, int64_t K, Act x, Act out, int64_t n0 = 0);
  void gemm_q4(const Q4Device& d, Act x, Act out);
  void gemm_q4_rows(const Q4Device& d, int64_t n0, int64_t nc, Act x, Act out, int64_t c0);
  void reserve_dequant_scratch(const Q4Device& d, int64_t T);
  int64_t dequant_chunk_rows(const Q4Device& d, int64_t T) const;
  void swiglu_sliced(Act x, const Q4Device& g, const Q4Device& u, Act out);
  // The decode GEMV's arguments for n weights sharing x (Store), gate+up (SwiGLU) or one weight
  // with the residual add; false when they cannot share one launch.
  bool decode_multi_args(Act x, const LinearOut* outs, int n, GemvQ4DecodeArgs& a) const;
  bool decode_swiglu_args(Act x, const Weight& gate, const Weight* bg, const Weight& up, const Weight* bu, Act out,
                          GemvQ4DecodeArgs& a) const;
  bool decode_residual_args(Act x, const Weight& w, const Weight* bias, Act resid, GemvQ4DecodeArgs& a) const;
  bool norm_fusable(const Weight& w, int64_t rows) const;
  bool gemm_q4_multi_args(Act x, const Weight* const* ws, int n, GemmQ4MultiArgs& a) const;
  // n weights sharing x that take plan p in one launch (same quantization parameters), their device
  // weights in out; false when they cannot.
  bool q4_group(Act x, const Weight* const* ws, int n, LinearPlan p, const Q4Device** out) const;
  // The skinny GEMM's arguments (outputs and biases left to the caller), and its launch with the
  // split workspace grown to what it needs first (outside graph capture).
  bool skinny_args(Act x, const Weight* const* ws, int n, GemmQ4SkinnyArgs& a) const;
  void run_skinny(GemmQ4SkinnyArgs& a);
  bool dense_multi(Act x, const LinearOut* outs, int n, const Act* swiglu_out);
  void dense_gemv(const CudaDense& d, Act x, const float* bias, Act out);
  Q4SplitWs split_ws() const;
  Q4SplitWs q4_split_ws(int64_t floats, int64_t tickets) const;

  // ---- attention helpers (cuda_attention.cu) ----
  RopeArgs rope_args(const Act& q, const Act& k, const RopeParams& p, const StepState& s) const;
  KvWriteArgs kv_write_args(int layer, const Act& k, const Act& v, const StepState& s) const;
  AttnArgs attn_args(int layer, const Act& q, const Act& out, const AttnParams& p, const StepState& s);
  AttnImpl resolve_attn(AttnImpl impl) const;
  // The paged step's rows for the kernels (checks that the cache is paged).
  PagedRows paged_rows(const PagedSeqs& p) const;
  // Attention of a paged step: flash-decoding over every sequence of at most kPagedDecodeRows rows,
  // then each longer sequence (a prompt chunk) through the prompt kernels over its blocks gathered.
  void attention_paged(const AttnArgs& base, AttnImpl impl, const StepState& s);
  static constexpr int kPagedDecodeRows = 16;
  void attention_eager_run(const AttnArgs& a, int64_t pos0_host);
  void check_layer(int layer) const {
    NF4FLASH_CHECK(k_cache_ && layer >= 0 && layer < kv_.n_layers, "KV cache: layer ", layer,
                   " out of range (kv_allocate first)");
  }
  void* layer_ptr(CudaBuffer* b, int layer) const {
    return static_cast<char*>(b->data()) +
           size_t(layer) * kv_.n_kv_heads * kv_.capacity * kv_.head_dim * dtype_size(kv_.dtype);
  }

  // ---- sampling helpers (cuda_backend.cu) ----
  // sample()'s and sample_to_device()'s arguments: the parameters, the workspace (allocated or
  // re-laid out for this vocabulary outside capture) and, with the penalty, the history uploaded
  cuda::SampleArgs sample_args(Act logits, const SamplingParams& p, float uniform, const int32_t* history,
                               int n_history);

  DType act_;
  bool tf32_;
  CudaTuning tuning_;
  // resolved from tuning_ at construction
  bool q4_gemm_fused_ = false;        // the fused GEMM serves 4-bit products above the GEMV rows
  int64_t q4_fused_max_rows_ = 0;     // ... up to this many rows
  int64_t q4_skinny_max_rows_ = 0;    // the skinny GEMM up to this many rows (tuning, capped by shared memory)
  bool q4_skinny_wgmma_ = false;      // its wgmma form at 17..32 rows (tuning; auto: where it runs)
  int64_t dequant_chunk_bytes_ = 0;   // dequantize + cuBLAS: row chunks of at most this size
  FlashKernel flash_kernel_ = FlashKernel::Mma;
  // 4-bit GEMM path (dequantize + cuBLAS): products of at least kDequantChunkMinRows rows dequantize
  // the weight in chunks of rows of at most dequant_chunk_bytes_, each multiplied right after
  // (cuBLAS writing that column slice of the output): the scratch is 32 MiB instead of the largest
  // weight (117 MB for 14336 x 4096), and the chunk is read back from L2. Fewer rows take the whole
  // matrix: at 512 rows a chunk's GEMM (e.g. 2048 x 512) left most SMs idle (H200: 141 -> 150 us
  // for 32 MiB chunks).
  static constexpr int64_t kDequantChunkMinRows = 2048;
  int64_t q4_scratch_numel_ = 0;  // the dequantize scratch the 4-bit weights need (reserved on first use)
  // Split workspace of the 4-bit GEMMs (q4_split_ws). The fused GEMM's split tail is sized for 16 MiB
  // of f32 slices, the largest tail the Llama-3-8B shapes take at 512 rows (64 units x 2 splits x
  // 256 x 128: o, down); the skinny GEMM grows it to what a launch needs.
  static constexpr int64_t kSplitWsFloats = int64_t(4) << 20, kSplitTickets = 1024;
  mutable std::unique_ptr<CudaBuffer> split_ws_, split_tickets_;

  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<CudaBuffer> cublas_ws_, scratch_, attn_ws_, eager_ws_, sample_scratch_, k_cache_, v_cache_;
  // linear_swiglu without g_tmp (swiglu_sliced): the gate product of one chunk of rows, [T, chunk]
  std::unique_ptr<CudaBuffer> swiglu_tmp_;
  std::unique_ptr<CudaBuffer> sample_hist_;  // device copy of the sampling history (grown as needed)
  int64_t sample_vocab_ = -1;  // the vocabulary the sampling workspace is laid out for
  // pinned: the ids of sample_to_device()'s slots, then sample()'s; an event per slot
  int32_t* host_ids_ = nullptr;
  cudaEvent_t slot_ev_[kSampleSlots] = {};
  KVCacheDesc kv_;
  // the paged cache (kv_allocate_paged): kv_.capacity = blocks * block_size positions per kv head;
  // a sequence's K/V gathered for the prompt kernels into gather_k_/gather_v_ [n_kv][gather_cap_][hd]
  bool paged_ = false;
  int block_size_ = 0;
  int64_t gather_cap_ = 0;
  std::unique_ptr<CudaBuffer> gather_k_, gather_v_;
  // sample_rows: the ids on the device, their pinned host copy (capacity rows_cap_), argmax scratch
  std::unique_ptr<CudaBuffer> rows_ids_, rows_scratch_;
  int32_t* rows_ids_host_ = nullptr;
  int64_t rows_cap_ = 0;
  std::vector<cudaGraphExec_t> graphs_;
  bool capturing_ = false;
  // upload() of large host buffers: two pinned staging buffers, filled by the host threads while
  // the other one is copied (created at the first such upload), and an event per buffer
  std::unique_ptr<CudaHostBuffer> staging_[2];
  cudaEvent_t staging_ev_[2] = {};
};

}  // namespace nf4flash::cuda_impl
