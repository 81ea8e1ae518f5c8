// The CUDA Backend class, shared by cuda_backend.cu (the factory) and cuda_linear.cu (linear and its
// fused forms). One device, one non-blocking stream, plain cudaMalloc per buffer, cuBLAS for
// many-row products, CUDA graphs over the stream. Every CUDA/cuBLAS call is checked with file:line.
// Buffers and the weight types live in cuda_resources.h.
//
// linear() paths (see linear_path(); measurements in docs/performance.md):
//   4-bit, T <= 32, bf16/f16  : register-prefetch GEMV on the repacked tile16x64 layout (8 rows a launch);
//                               q/k/v together and gate+up+SiLU: the stream-K GEMV (T <= 8)
//   4-bit, 32 < T <= 512      : on Hopper (sm_90a build, bf16/f16) the fused wgmma GEMM, q/k/v as one
//                               launch, gate+up as one + silu_mul, the last partial wave split along K
//                               (NF4FLASH_Q4_GEMM / NF4FLASH_Q4GEMM_FUSED_MAX_ROWS); elsewhere and
//   4-bit, T > 512            : dequantize the layer into a scratch buffer, cublasGemmEx
//   4-bit, shape the layout cannot hold (cols % 64, blocksize < 64): dequantized at load, dense
//   dense, T <= 8             : warp-per-row GEMV (16-byte streaming loads)
//   dense, T > 8              : cublasGemmEx (weight converted to the compute dtype if needed)
#pragma once
#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/attn_eager.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_resources.h"
#include "backend/cuda/l2_prefetch_plan.h"
#include "backend/cuda/launchers.h"
#include "io/safetensors.h"

namespace nf4flash::cuda_impl {

using namespace cuda;

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o)
      : act_(o.compute), tf32_(o.tf32), q4_tile_group_(o.q4_tile_group), gemv_ablate_(o.gemv_ablate) {
    NF4FLASH_CHECK(q4_tile_group_ >= 0, "q4_tile_group: ", q4_tile_group_, " (0 or a group size)");
    NF4FLASH_CHECK(gemv_ablate_ == 0 || gemv_ablate_ == 1 || gemv_ablate_ == 2 || gemv_ablate_ == 7, "gemv_ablate: ",
                   gemv_ablate_, " (0; 1: no code table, 2: no absmax path, 7: no decode at all)");
    NF4FLASH_CHECK(act_ == DType::BF16 || act_ == DType::F16 || act_ == DType::F32,
                   "--compute-dtype: ", dtype_name(act_), " is not supported on CUDA (bf16, f16, f32)");
    CUDA_CHECK(cudaSetDevice(o.device_index));
    CUDA_CHECK(cudaFree(nullptr));  // the context now, so the trace below separates it
    vram_trace("context");
    CUDA_CHECK(cudaGetDeviceProperties(&props_, o.device_index));
    // Per-thread stack: the driver reserves limit x resident threads of local memory (1 KiB x 2048 x
    // 132 SMs = 277 MB on an H200 by default; 256 bytes: 69 MB). Our kernels need none; the driver
    // raises the limit at the launch of any kernel (ours or a library's) that needs more ("the
    // driver automatically increases the per-thread stack size for each kernel launch as needed",
    // cuCtxSetLimit), so 0 reserves only what the kernels actually run need (H200 peak VRAM at ctx
    // 8192: 6.47 -> 6.28 GiB for 256 bytes, docs/performance.md). NF4FLASH_CUDA_STACK_BYTES overrides.
    {
      size_t stack = 0;
      if (const char* v = std::getenv("NF4FLASH_CUDA_STACK_BYTES"); v && *v) stack = size_t(std::max(0, std::atoi(v)));
      CUDA_CHECK(cudaDeviceSetLimit(cudaLimitStackSize, stack));
    }
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    vram_trace("stack limit + stream");
    CUBLAS_CHECK(cublasCreate(&cublas_));
    vram_trace("cublasCreate");
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    cublas_ws_ = std::make_unique<CudaBuffer>(size_t(32) << 20);
    CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_->data(), cublas_ws_->bytes()));
    CUBLAS_CHECK(cublasSetMathMode(cublas_, tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    stream_gemv_ = gemv_q4_stream_supported();
    if (const char* v = std::getenv("NF4FLASH_GEMV_MAX_ROWS")) gemv_max_rows_ = std::clamp(std::atoi(v), 0, 256);
    if (const char* v = std::getenv("NF4FLASH_DEQUANT_CHUNK_MB"))
      dequant_chunk_bytes_ = int64_t(std::clamp(std::atoi(v), 0, 4096)) << 20;
    // NF4FLASH_Q4_GEMM: "auto" (the default: the fused wgmma GEMM for up to q4_fused_max_rows_
    // rows where it can run, dequantize + cuBLAS above), "fused" (always; an error where it cannot
    // run) or "dequant" (never); kernel-bench compares them
    const bool fused_ok = act_ != DType::F32 && gemm_q4_wgmma_supported();
    q4_gemm_fused_ = fused_ok;
    if (const char* v = std::getenv("NF4FLASH_Q4GEMM_FUSED_MAX_ROWS"); v && *v)
      q4_fused_max_rows_ = std::max<int64_t>(0, std::atoll(v));
    if (const char* v = std::getenv("NF4FLASH_Q4_GEMM"); v && *v) {
      const std::string_view m(v);
      NF4FLASH_CHECK(m == "fused" || m == "dequant" || m == "auto", "NF4FLASH_Q4_GEMM=", m,
                     ": expected auto, fused or dequant");
      q4_gemm_fused_ = m != "dequant" && fused_ok;
      if (m == "fused") {
        NF4FLASH_CHECK(q4_gemm_fused_, "NF4FLASH_Q4_GEMM=fused: the fused 4-bit GEMM needs bf16/f16 compute, a build for "
                       "sm_90a and a compute capability 9.0 GPU (this: ", props_.major, ".", props_.minor,
                       gemm_q4_wgmma_built() ? "" : ", built without sm_90a", ")");
        q4_fused_max_rows_ = INT64_MAX;
      }
    }
    if (!q4_gemm_fused_) q4_fused_max_rows_ = 0;
    if (const char* v = std::getenv("NF4FLASH_Q4GEMM_SWIGLU"); v && *v) q4_fused_swiglu_ = std::atoi(v) != 0;
    chain_cnt_ = std::make_unique<CudaBuffer>(size_t(kGemvChainMaxStages + 1) * 4);
    CUDA_CHECK(cudaMemsetAsync(chain_cnt_->data(), 0, chain_cnt_->bytes(), stream_));
    if (const char* v = std::getenv("NF4FLASH_GEMV_SK"); v && std::string_view(v) == "1") {
      // the opt-in stream-K GEMV (gemv_q4_lean.cuh): slots for up to 4 blocks per SM (2 resident today)
      sk_cap_ = 4 * props_.multiProcessorCount;
      sk_slots_ = std::make_unique<CudaBuffer>(size_t(sk_cap_) * kGemvSkSlotBytes);
      CUDA_CHECK(cudaMemsetAsync(sk_slots_->data(), 0, sk_slots_->bytes(), stream_));
    }
    if (stream_gemv_) {
      qs_partials_ = std::make_unique<CudaBuffer>(size_t(gemv_q4_stream_partials_floats()) * 4);
      qs_counters_ = std::make_unique<CudaBuffer>(size_t(kQsCounters) * 4);
      CUDA_CHECK(cudaMemsetAsync(qs_counters_->data(), 0, qs_counters_->bytes(), stream_));
      sync();
    }
    CUDA_CHECK(cudaMallocHost(&host_ids_, sizeof(int32_t) * (kSampleSlots + 1)));
    for (auto& e : slot_ev_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~CudaBackend() override {
    for (auto e : graphs_) cudaGraphExecDestroy(e);
    for (auto e : slot_ev_)
      if (e) cudaEventDestroy(e);
    if (host_ids_) cudaFreeHost(host_ids_);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Device device() const override { return Device::CUDA; }
  std::string name() const override {
    return cat("cuda (", props_.name, ", sm_", props_.major, props_.minor, ", ", props_.multiProcessorCount,
               " SMs, ", dtype_name(act_), ")");
  }
  DType act_dtype() const override { return act_; }

  // ---- memory ----
  std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<CudaBuffer>(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void sync() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  size_t free_memory() const override {
    size_t f = 0, t = 0;
    CUDA_CHECK(cudaMemGetInfo(&f, &t));
    return f;
  }

  // ---- weights ----
  std::unique_ptr<Weight> upload_dense(const TensorInfo& t, DType store) override {
    NF4FLASH_CHECK(store == DType::F32 || store == DType::BF16 || store == DType::F16, t.name,
                   ": cannot store as ", dtype_name(store), " on CUDA");
    const int64_t n = t.numel();
    const int64_t rows = t.shape.size() >= 2 ? t.shape[0] : 1;
    const int64_t cols = rows ? n / rows : 0;
    auto w = std::make_unique<CudaDense>(store, rows, cols);
    std::vector<uint8_t> host;
    const void* src = t.data;
    if (t.dtype != store) {
      host.resize(size_t(n) * dtype_size(store));
      for (int64_t i = 0; i < n; ++i) host_store(host.data(), store, i, host_load(t.data, t.dtype, i));
      src = host.data();
    }
    w->data = std::make_unique<CudaBuffer>(size_t(n) * dtype_size(store));
    upload(w->data->data(), src, w->data->bytes());
    if (rows == 1) {
      std::vector<float> f(n);
      for (int64_t i = 0; i < n; ++i) f[i] = host_load(t.data, t.dtype, i);
      w->f32 = std::make_unique<CudaBuffer>(size_t(n) * 4);
      upload(w->f32->data(), f.data(), w->f32->bytes());
    }
    if (store != act_) reserve_scratch(n);
    w->set_size();
    return w;
  }

  std::unique_ptr<Weight> upload_embedding(const TensorInfo& t, DType store, bool tied) override {
    if (tied || t.shape.size() != 2) return upload_dense(t, store);
    NF4FLASH_CHECK(store == DType::F32 || store == DType::BF16 || store == DType::F16, t.name,
                   ": cannot store as ", dtype_name(store), " on CUDA");
    auto w = std::make_unique<CudaDense>(store, t.shape[0], t.shape[1]);
    const int64_t n = t.numel();
    auto hb = std::make_unique<CudaHostBuffer>(size_t(n) * dtype_size(store));
    uint8_t* dst = static_cast<uint8_t*>(hb->data());
    if (t.dtype == store) std::memcpy(dst, t.data, hb->bytes());
    else for (int64_t i = 0; i < n; ++i) host_store(dst, store, i, host_load(t.data, t.dtype, i));
    w->data = std::move(hb);
    w->on_host = true;
    w->set_size();
    return w;
  }

  std::unique_ptr<Weight> upload_quant4(std::shared_ptr<const Quant4Tensor> qp) override {
    const Quant4Tensor& q = *qp;
    NF4FLASH_CHECK(q.rows > 0 && q.cols > 0 && q.packed.size() == size_t((q.numel() + 1) / 2),
                   "4-bit weight [", q.rows, ", ", q.cols, "]: packed size ", q.packed.size(), " does not match");
    auto w = std::make_unique<CudaQ4>(q);
    std::string why;
    if (q.cols % 64) why = cat("in_features ", q.cols, " not a multiple of 64");
    else if (!is_pow2(q.blocksize) || q.blocksize < 64) why = cat("blocksize ", q.blocksize, " (need a power of two >= 64)");
    else if (q.double_quant && !is_pow2(q.nested_blocksize)) why = cat("nested blocksize ", q.nested_blocksize);
    if (!why.empty()) {
      // Dequantize on the host (exact bitsandbytes arithmetic) and keep it dense.
      std::vector<float> f(size_t(q.numel()));
      for (int64_t i = 0; i < q.numel(); ++i) {
        const uint8_t b = q.packed[size_t(i / 2)];
        f[size_t(i)] = q.code[(i & 1) ? (b & 15) : (b >> 4)] * q.block_absmax(i / q.blocksize);
      }
      TensorInfo ti;
      ti.name = "4-bit weight";
      ti.dtype = DType::F32;
      ti.shape = {q.rows, q.cols};
      ti.data = reinterpret_cast<const uint8_t*>(f.data());
      ti.nbytes = f.size() * 4;
      w->fallback.reset(static_cast<CudaDense*>(upload_dense(ti, act_).release()));
      w->fallback_why = why;
      w->set_bytes(w->fallback->resident_bytes());
      return w;
    }
    Q4Device& d = w->dev;
    d.rows = q.rows;
    d.cols = q.cols;
    d.RT = (q.rows + 15) / 16;
    d.KT = q.cols / 64;
    d.log2_blocksize = ilog2(q.blocksize);
    d.log2_nested = ilog2(q.nested_blocksize);
    d.double_quant = q.double_quant;
    d.offset = q.offset;
    for (int i = 0; i < 16; ++i) d.code[i] = q.code[size_t(i)];
    // codes: upload flat, repack on the GPU
    {
      CudaBuffer flat(q.packed.size());
      upload(flat.data(), q.packed.data(), q.packed.size());
      w->tiles = std::make_unique<CudaBuffer>(size_t(d.RT * d.KT * 512));
      q4_repack(static_cast<const uint8_t*>(flat.data()), q.rows, q.cols, static_cast<uint8_t*>(w->tiles->data()), stream_);
      sync();
    }
    d.tiles = static_cast<const uint8_t*>(w->tiles->data());
    // absmax per (row tile, col tile, row)
    const int64_t n_t = d.RT * d.KT * 16;
    auto block_of = [&](int64_t rt, int64_t kt, int r) -> int64_t {
      const int64_t row = rt * 16 + r;
      return row < q.rows ? (row * q.cols + kt * 64) >> d.log2_blocksize : -1;
    };
    if (!q.double_quant) {
      std::vector<float> at(size_t(n_t), 0.f);
      for (int64_t rt = 0; rt < d.RT; ++rt)
        for (int64_t kt = 0; kt < d.KT; ++kt)
          for (int r = 0; r < 16; ++r) {
            const int64_t b = block_of(rt, kt, r);
            if (b >= 0) at[size_t((rt * d.KT + kt) * 16 + r)] = q.absmax[size_t(b)];
          }
      w->absmax = std::make_unique<CudaBuffer>(at.size() * 4);
      upload(w->absmax->data(), at.data(), w->absmax->bytes());
      d.absmax_tiled = static_cast<const float*>(w->absmax->data());
    } else {
      std::vector<uint8_t> at(size_t(n_t), 0);
      for (int64_t rt = 0; rt < d.RT; ++rt)
        for (int64_t kt = 0; kt < d.KT; ++kt)
          for (int r = 0; r < 16; ++r) {
            const int64_t b = block_of(rt, kt, r);
            if (b >= 0) at[size_t((rt * d.KT + kt) * 16 + r)] = q.absmax_q[size_t(b)];
          }
      w->absmax = std::make_unique<CudaBuffer>(at.size());
      upload(w->absmax->data(), at.data(), at.size());
      d.absq_tiled = static_cast<const uint8_t*>(w->absmax->data());
      w->nested_absmax = std::make_unique<CudaBuffer>(q.nested_absmax.size() * 4);
      upload(w->nested_absmax->data(), q.nested_absmax.data(), w->nested_absmax->bytes());
      d.nested_absmax = static_cast<const float*>(w->nested_absmax->data());
      w->nested_code = std::make_unique<CudaBuffer>(256 * 4);
      upload(w->nested_code->data(), q.nested_code.data(), 256 * 4);
      d.nested_code = static_cast<const float*>(w->nested_code->data());
      w->nested_code_host.assign(q.nested_code.begin(), q.nested_code.end());
    }
    if (q4_tile_group_ > 0 && d.KT % q4_tile_group_ == 0) {  // kernel-bench's grouped layout: codes and absmax
      auto group = [&](std::unique_ptr<CudaBuffer>& b, int rec_bytes) {
        auto grouped = std::make_unique<CudaBuffer>(b->bytes());
        q4_group_tiles(static_cast<const uint8_t*>(b->data()), d.RT, d.KT, q4_tile_group_, rec_bytes,
                       static_cast<uint8_t*>(grouped->data()), stream_);
        sync();
        b = std::move(grouped);
      };
      group(w->tiles, 512);
      group(w->absmax, q.double_quant ? 16 : 64);
      d.tiles = static_cast<const uint8_t*>(w->tiles->data());
      if (q.double_quant) d.absq_tiled = static_cast<const uint8_t*>(w->absmax->data());
      else d.absmax_tiled = static_cast<const float*>(w->absmax->data());
      d.tile_group = q4_tile_group_;
    }
    // the fused GEMM needs no scratch; rows past q4_fused_max_rows_ take dequantize + cuBLAS, whose
    // scratch is allocated at the first such product (gemm_q4)
    if (q4_fused_max_rows_ != INT64_MAX) q4_scratch_numel_ = std::max(q4_scratch_numel_, d.rows * d.cols);
    w->set_bytes(w->tiles->bytes() + w->absmax->bytes() + (w->nested_absmax ? w->nested_absmax->bytes() : 0) +
                  (w->nested_code ? w->nested_code->bytes() : 0));
    return w;
  }

  // ---- ops ----
  void embed(const Weight& table, const int32_t* ids, Act out) override {
    const CudaDense& t = as_dense(table, "embed");
    check_act(out, "embed");
    NF4FLASH_CHECK(out.cols == t.cols(), "embed: hidden ", out.cols, " != table cols ", t.cols());
    cuda::embed(t.data->data(), t.dtype(), t.rows(), t.cols(), ids, out.rows, out.data, act_, stream_);
  }
  void rms_norm(Act x, const Weight& w, float eps, Act out) override {
    check_act(x, "rms_norm");
    check_act(out, "rms_norm");
    NF4FLASH_CHECK(x.rows == out.rows && x.cols == out.cols, "rms_norm: shape mismatch");
    cuda::rms_norm(x.data, vec_f32(w, x.cols, "rms_norm weight"), eps, x.rows, x.cols, out.data, act_, stream_);
  }
  void linear(Act x, const Weight& w, const Weight* bias, Act out) override;
  void linear_multi(Act x, const LinearOut* outs, int n) override;
  void rms_norm_linear_multi(Act x, const Weight& norm_w, float eps, Act xn, const LinearOut* outs, int n) override;
  void rms_norm_linear_swiglu(Act x, const Weight& norm_w, float eps, Act xn, const Weight& gate, const Weight* bg,
                              const Weight& up, const Weight* bu, Act g_tmp, Act out) override;
  bool fuses_norm_linear(const Weight& w, int64_t rows) const override;
  void linear_residual(Act x, const Weight& w, const Weight* bias, Act tmp, Act resid) override;
  void linear_chain(const ChainStage* st, int n) override;
  bool chain_is_one_launch(const ChainStage* st, int n) const override { return chain_launch(st, n, false); }
  void linear_swiglu(Act x, const Weight& gate, const Weight* bg, const Weight& up, const Weight* bu, Act g_tmp,
                     Act out) override;
  bool linear_swiglu_needs_tmp(const Weight& gate, const Weight& up, int64_t rows, bool bias) const override;
  void rope_kv_write(int layer, Act q, Act k, Act v, const RopeParams& p, const StepState& s) override {
    cuda::rope_kv_write(rope_args(q, k, p, s), kv_write_args(layer, k, v, s), stream_);
  }
  void rope(Act q, Act k, const RopeParams& p, const StepState& s) override {
    cuda::rope(rope_args(q, k, p, s), stream_);
  }
  void kv_write(int layer, Act k, Act v, const StepState& s) override {
    cuda::kv_write(kv_write_args(layer, k, v, s), stream_);
  }
  void attention(int layer, Act q, Act out, const AttnParams& p, const StepState& s) override {
    AttnArgs a = attn_args(layer, q, out, p, s);
    const AttnImpl impl = resolve_attn(p.impl);
    if (impl == AttnImpl::Eager) {
      attention_eager_run(a, capturing_ ? -1 : s.pos0_host);
    } else if (a.T <= kDecodeMaxRows) {
      attention_decode(a, stream_);
    } else if (impl == AttnImpl::Flash) {
      attention_flash(a, stream_);
    } else {
      attention_prefill(a, stream_);
    }
  }
  // One token's rope + cache write + decode attention in one launch (attention_decode_rope) where
  // it applies; else the two ops. q and k stay unrotated in the fused launch.
  void rope_kv_attention(int layer, Act q, Act k, Act v, Act out, const RopeParams& rp, const AttnParams& ap,
                         const StepState& s) override {
    if (q.rows == 1 && attention_decode_rope_enabled() && resolve_attn(ap.impl) != AttnImpl::Eager) {
      const KvWriteArgs kv = kv_write_args(layer, k, v, s);  // the shape checks of the unfused ops
      NF4FLASH_CHECK(rp.head_dim == ap.head_dim, "rope_kv_attention: rope head_dim ", rp.head_dim,
                     " != attention head_dim ", ap.head_dim);
      AttnArgs a = attn_args(layer, q, out, ap, s);
      a.k_new = kv.k;
      a.v_new = kv.v;
      a.inv_freq = rp.inv_freq;
      if (attention_decode_rope_unsupported(a).empty()) {
        attention_decode_rope(a, stream_);
        return;
      }
    }
    Backend::rope_kv_attention(layer, q, k, v, out, rp, ap, s);
  }
  // The arguments of every attention kernel; decode's split workspace and merge counters attached.
  AttnArgs attn_args(int layer, const Act& q, const Act& out, const AttnParams& p, const StepState& s) {
    check_layer(layer);
    check_act(q, "attention");
    check_act(out, "attention");
    const std::string why = attn_unsupported_reason(p.impl, p.head_dim);
    NF4FLASH_CHECK(why.empty(), why);
    NF4FLASH_CHECK(p.n_kv_heads == kv_.n_kv_heads && p.head_dim == kv_.head_dim,
                   "attention: n_kv_heads/head_dim differ from the KV cache");
    NF4FLASH_CHECK(q.cols == int64_t(p.n_heads) * p.head_dim && out.cols == q.cols && out.rows == q.rows,
                   "attention: q/out width ", q.cols, " != n_heads*head_dim");
    AttnArgs a;
    a.q = q.data;
    a.out = out.data;
    a.act = act_;
    a.q_stride = q.cols;
    a.out_stride = out.cols;
    a.k_cache = layer_ptr(k_cache_.get(), layer);
    a.v_cache = layer_ptr(v_cache_.get(), layer);
    a.kv_dtype = kv_.dtype;
    a.capacity = kv_.capacity;
    a.T = int(q.rows);
    a.n_heads = p.n_heads;
    a.n_kv = p.n_kv_heads;
    a.head_dim = p.head_dim;
    a.scale = p.scale;
    a.pos0 = s.pos0;
    a.num_sms = props_.multiProcessorCount;
    if (a.T <= kDecodeMaxRows) {
      const int64_t need = attention_decode_workspace_floats(kDecodeMaxRows, p.n_heads, p.head_dim);
      if (!attn_ws_ || attn_ws_->bytes() < size_t(need) * 4) {
        NF4FLASH_CHECK(!capturing_, "attention: decode workspace must be sized before graph capture");
        attn_ws_ = std::make_unique<CudaBuffer>(size_t(need) * 4);
      }
      a.workspace = static_cast<float*>(attn_ws_->data());
      a.workspace_floats = need;
      // the merge counters (kv_allocate zeroes them once; each launch leaves them zero)
      NF4FLASH_CHECK(int64_t(a.T) * a.n_heads <= kDecodeCounters, "attention: ", a.n_heads, " heads exceed the decode counters");
      a.counters = static_cast<int*>(attn_cnt_->data());
    }
    return a;
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
    check_act(gate, "silu_mul");
    check_act(up, "silu_mul");
    check_act(out, "silu_mul");
    NF4FLASH_CHECK(gate.numel() == up.numel() && out.numel() == gate.numel(), "silu_mul: size mismatch");
    cuda::silu_mul(gate.data, up.data, out.data, gate.numel(), act_, stream_);
  }
  void add(Act a, Act b, Act out) override {
    check_act(a, "add");
    check_act(b, "add");
    check_act(out, "add");
    NF4FLASH_CHECK(a.numel() == b.numel() && out.numel() == a.numel(), "add: size mismatch");
    cuda::add(a.data, b.data, out.data, a.numel(), act_, stream_);
  }

  // ---- KV cache ----
  void kv_allocate(const KVCacheDesc& d) override {
    NF4FLASH_CHECK(d.dtype == DType::F32 || d.dtype == DType::BF16 || d.dtype == DType::F16,
                   "KV cache dtype ", dtype_name(d.dtype), " not supported on CUDA");
    k_cache_.reset();
    v_cache_.reset();
    kv_ = d;
    const size_t bytes = size_t(d.n_layers) * d.n_kv_heads * d.capacity * d.head_dim * dtype_size(d.dtype);
    k_cache_ = std::make_unique<CudaBuffer>(bytes);
    v_cache_ = std::make_unique<CudaBuffer>(bytes);
    if (bytes) {
      CUDA_CHECK(cudaMemsetAsync(k_cache_->data(), 0, bytes, stream_));
      CUDA_CHECK(cudaMemsetAsync(v_cache_->data(), 0, bytes, stream_));
    }
    // decode workspace sized for up to 8 q heads per kv head (more: resized on first use)
    const int64_t need = attention_decode_workspace_floats(kDecodeMaxRows, std::max(64, d.n_kv_heads * 8), d.head_dim);
    if (!attn_ws_ || attn_ws_->bytes() < size_t(need) * 4) attn_ws_ = std::make_unique<CudaBuffer>(size_t(need) * 4);
    if (!attn_cnt_) {
      attn_cnt_ = std::make_unique<CudaBuffer>(size_t(kDecodeCounters) * 4);
      CUDA_CHECK(cudaMemsetAsync(attn_cnt_->data(), 0, attn_cnt_->bytes(), stream_));
    }
    sync();
  }
  const KVCacheDesc& kv_desc() const override { return kv_; }
  size_t kv_bytes() const override { return (k_cache_ ? k_cache_->bytes() : 0) + (v_cache_ ? v_cache_->bytes() : 0); }

  std::string attn_unsupported_reason(AttnImpl impl, int head_dim) const override {
    if (head_dim != 64 && head_dim != 128)
      return cat("unsupported head_dim ", head_dim, " for the CUDA attention kernels; supported: 64, 128");
    // flash needs the KV cache in the compute dtype: the engine allocates it so (checked per call too)
    if (impl == AttnImpl::Flash) return attention_flash_unsupported(act_, act_, head_dim);
    return "";
  }
  // Auto: flash where it serves (bf16/f16 compute), else sdpa. The kernel of a step: T <= 4 rows
  // take the flash-decoding kernel for flash, sdpa and auto; eager materializes scores always.
  AttnImpl resolve_attn(AttnImpl impl) const {
    if (impl != AttnImpl::Auto) return impl;
    return attention_flash_unsupported(act_, act_, 128).empty() ? AttnImpl::Flash : AttnImpl::Sdpa;
  }
  std::string attn_path(AttnImpl impl) const override {
    if (impl != AttnImpl::Flash) return std::string(attn_impl_name(impl));
    return attention_flash_kernel() == FlashKernel::Mma ? "flash (mma.sync)" : "flash (wgmma)";
  }
  std::string linear_path(const Weight& w, int64_t rows) const override;

  // ---- graphs ----
  bool graphs_supported() const override { return true; }
  void capture_begin() override {
    NF4FLASH_CHECK(!capturing_, "capture_begin: already capturing");
    pf_.begin(props_.l2CacheSize, props_.major);
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
  }
  int capture_end() override {
    NF4FLASH_CHECK(capturing_, "capture_end without capture_begin");
    capturing_ = false;
    cudaGraph_t g = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    cudaGraphExec_t e = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
    CUDA_CHECK(cudaGraphDestroy(g));
    graphs_.push_back(e);
    pf_.end();
    return int(graphs_.size()) - 1;
  }
  void replay(int id) override {
    NF4FLASH_CHECK(id >= 0 && size_t(id) < graphs_.size(), "replay: unknown graph ", id);
    CUDA_CHECK(cudaGraphLaunch(graphs_[size_t(id)], stream_));
  }

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
  RopeArgs rope_args(const Act& q, const Act& k, const RopeParams& p, const StepState& s) const {
    check_act(q, "rope");
    check_act(k, "rope");
    NF4FLASH_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0 && q.cols % p.head_dim == 0 && k.cols % p.head_dim == 0,
                   "rope: head_dim ", p.head_dim, " does not divide q/k widths");
    NF4FLASH_CHECK(q.rows == k.rows, "rope: q and k rows differ");
    RopeArgs a;
    a.q = q.data;
    a.k = k.data;
    a.act = act_;
    a.T = q.rows;
    a.n_q_heads = int(q.cols / p.head_dim);
    a.n_k_heads = int(k.cols / p.head_dim);
    a.head_dim = p.head_dim;
    a.q_stride = q.cols;
    a.k_stride = k.cols;
    a.inv_freq = p.inv_freq;
    a.pos0 = s.pos0;
    return a;
  }
  KvWriteArgs kv_write_args(int layer, const Act& k, const Act& v, const StepState& s) const {
    check_layer(layer);
    check_act(k, "kv_write");
    check_act(v, "kv_write");
    NF4FLASH_CHECK(k.cols == int64_t(kv_.n_kv_heads) * kv_.head_dim && v.cols == k.cols && v.rows == k.rows,
                   "kv_write: k/v width ", k.cols, " != n_kv_heads*head_dim ", kv_.n_kv_heads * kv_.head_dim);
    KvWriteArgs a;
    a.k = k.data;
    a.v = v.data;
    a.act = act_;
    a.k_stride = k.cols;
    a.v_stride = v.cols;
    a.k_cache = layer_ptr(k_cache_.get(), layer);
    a.v_cache = layer_ptr(v_cache_.get(), layer);
    a.kv_dtype = kv_.dtype;
    a.T = k.rows;
    a.capacity = kv_.capacity;
    a.n_kv = kv_.n_kv_heads;
    a.head_dim = kv_.head_dim;
    a.pos0 = s.pos0;
    return a;
  }
  void check_act(const Act& a, const char* what) const {
    NF4FLASH_CHECK(a.dtype == act_, what, ": activation dtype ", dtype_name(a.dtype), " != backend compute dtype ",
                   dtype_name(act_));
  }
  void check_layer(int layer) const {
    NF4FLASH_CHECK(k_cache_ && layer >= 0 && layer < kv_.n_layers, "KV cache: layer ", layer,
                   " out of range (kv_allocate first)");
  }
  void* layer_ptr(CudaBuffer* b, int layer) const {
    return static_cast<char*>(b->data()) +
           size_t(layer) * kv_.n_kv_heads * kv_.capacity * kv_.head_dim * dtype_size(kv_.dtype);
  }
  int64_t q4_scratch_numel_ = 0;  // the dequantize scratch the 4-bit weights need (reserved on first use)
  // linear_swiglu without g_tmp (swiglu_sliced): the gate product of one chunk of rows, [T, chunk]
  std::unique_ptr<CudaBuffer> swiglu_tmp_;
  void swiglu_sliced(Act x, const cuda::Q4Device& g, const cuda::Q4Device& u, Act out);
  void reserve_dequant_scratch(const cuda::Q4Device& d, int64_t T);
  void reserve_scratch(int64_t numel) {
    const size_t need = size_t(numel) * dtype_size(act_);
    if (!scratch_ || scratch_->bytes() < need) {
      scratch_.reset();
      scratch_ = std::make_unique<CudaBuffer>(need);
    }
  }
  // out[:, n0 : n0+N] = x[T, K] * W[N, K]^T; out has out.cols columns (the leading dimension).
  void gemm(const void* w, int64_t N, int64_t K, Act x, Act out, int64_t n0 = 0);
  void check_linear(const Act& x, const Weight& w, const Act& out) const {
    check_act(x, "linear");
    NF4FLASH_CHECK(out.dtype == act_ || out.dtype == DType::F32, "linear: output dtype ", dtype_name(out.dtype));
    NF4FLASH_CHECK(x.cols == w.cols() && out.cols == w.rows() && out.rows == x.rows, "linear: x [", x.rows, ", ",
                   x.cols, "] * W[", w.rows(), ", ", w.cols(), "]^T -> out [", out.rows, ", ", out.cols, "]");
  }
  // The 4-bit weight when `rows` rows take the stream-K GEMV, else null. `single`: a lone GEMV
  // (linear, linear_residual) takes it only with NF4FLASH_GEMV_Q4=stream: on the H200 the
  // register-prefetch kernel is faster alone (18.0 vs 27.2 us on nf4-dq 4096x14336), the
  // stream-K kernel when it fuses (q/k/v: 16.7 vs 19.5 us; gate+up+SiLU: 41.7 vs ~44 us).
  const CudaQ4* stream_q4(const Weight& w, int64_t rows, bool single = false) const {
    auto* q = dynamic_cast<const CudaQ4*>(&w);
    if (!q || q->fallback || !stream_gemv_ || act_ == DType::F32 || rows < 1 || rows > kGemvMaxRows ||
        rows > gemv_max_rows_ || !gemv_q4_stream_enabled() || (single && !gemv_q4_stream_all()))
      return nullptr;
    return q;
  }
  // same quantization (and, with cols, the same in_features: weights sharing one x)
  static bool same_q4_params(const CudaQ4& a, const CudaQ4& b, bool cols = true) {
    const Q4Device &x = a.dev, &y = b.dev;
    return (!cols || x.cols == y.cols) && x.double_quant == y.double_quant && x.log2_blocksize == y.log2_blocksize &&
           x.log2_nested == y.log2_nested && std::equal(x.code, x.code + 16, y.code) &&
           a.nested_code_host == b.nested_code_host;
  }
  bool gemv_multi_args(Act x, const LinearOut* outs, int n, bool seq, GemvQ4MultiArgs& a) const;
  // The in-order GEMV's arguments of rms_norm_linear_multi / rms_norm_linear_swiglu /
  // linear_residual where one lean launch serves them (false: the op's other paths), and of a chain
  // stage (cuda_linear.cu).
  bool norm_multi_args(Act x, const Weight& norm_w, float eps, const LinearOut* outs, int n, GemvQ4MultiArgs& a) const;
  bool norm_swiglu_args(Act x, const Weight& norm_w, float eps, const Weight& gate, const Weight* bg, const Weight& up,
                        const Weight* bu, Act out, GemvQ4MultiArgs& a) const;
  bool seq_residual_args(Act x, const Weight& w, const Weight* bias, Act resid, GemvQ4MultiArgs& a) const;
  GemvQ4MultiArgs q4_residual_args(Act x, const CudaQ4& q, const Weight* bias, Act resid) const;
  void dense_gemv(const CudaDense& d, Act x, const float* bias, Act out, bool residual);
  bool chain_stage_args(const ChainStage& c, GemvQ4MultiArgs& a, const CudaQ4*& q0) const;
  bool chain_launch(const ChainStage* st, int n, bool launch) const;  // false: not one launch
  bool dense_multi(Act x, const LinearOut* outs, int n, const Act* swiglu_out, const float* norm_w = nullptr,
                   float norm_eps = 0.f);
  bool dense_norm_fusable(const Weight& w, int64_t rows) const;  // cuda_linear.cu
  bool gemv_swiglu_args(Act x, const Weight& gate, const Weight* bg, const Weight& up, const Weight* bu, Act out,
                        bool seq, GemvQ4MultiArgs& a) const;
  GemvQ4MultiArgs multi_args(Act x) const {
    GemvQ4MultiArgs a;
    a.x = x.data;
    a.act = act_;
    a.T = int(x.rows);
    a.out_dtype = act_;
    a.partials = qs_partials_ ? static_cast<float*>(qs_partials_->data()) : nullptr;
    a.counters = qs_counters_ ? static_cast<int*>(qs_counters_->data()) : nullptr;
    a.counters_len = kQsCounters;
    a.sk_slots = sk_slots_ ? static_cast<unsigned long long*>(sk_slots_->data()) : nullptr;
    a.sk_cap = sk_cap_;
    a.ablate = gemv_ablate_;
    return a;
  }
  static constexpr int64_t kQsCounters = 1 << 16;
  bool stream_gemv_ = false;
  // 4-bit linears of up to this many rows take the GEMV (in chunks of kGemvMaxRows), more the
  // dequantize + cuBLAS path. Measured crossover on the H200 (kernel-bench "threshold" rows,
  // docs/performance.md): see kGemvRowsDefault.
  int gemv_max_rows_ = kGemvRowsDefault;
  // 4-bit GEMM path (dequantize + cuBLAS): products of at least kDequantChunkMinRows rows dequantize
  // the weight in chunks of rows of at most dequant_chunk_bytes_ (NF4FLASH_DEQUANT_CHUNK_MB; 0 = the
  // whole matrix always), each multiplied right after (cuBLAS writing that column slice of the
  // output): the scratch is 32 MiB instead of the largest weight (117 MB for 14336 x 4096), and the
  // chunk is read back from L2. Fewer rows take the whole matrix: at 512 rows a chunk's GEMM
  // (e.g. 2048 x 512) left most SMs idle (H200: 141 -> 150 us for 32 MiB chunks, kernel-bench
  // "prefill" rows, docs/performance.md).
  int64_t dequant_chunk_bytes_ = int64_t(32) << 20;
  static constexpr int64_t kDequantChunkMinRows = 2048;
  // 4-bit GEMM path (T above the GEMV threshold): the fused wgmma kernel (sm_90a) or dequantize +
  // cuBLAS. Measured on the H200: kernel-bench "prefill" rows, docs/performance.md.
  bool q4_gemm_fused_ = false;
  // Rows up to which the fused GEMM serves 4-bit linears (NF4FLASH_Q4GEMM_FUSED_MAX_ROWS). H200,
  // NF4-dq Llama-3-8B shape, TTFT fused vs dequantize + cuBLAS: 512 rows 17.3 vs 19.6 ms, 1024
  // rows 31.1 vs 30.6; one layer's linears (kernel-bench "prefill layer") T=512 521 vs 574 us,
  // T=4096 3406 vs 3012 (docs/performance.md, fifth session).
  int64_t q4_fused_max_rows_ = kQ4FusedMaxRowsDefault;
  static constexpr int64_t kQ4FusedMaxRowsDefault = 512;
  // gate+up as one launch with the SwiGLU epilogue (NF4FLASH_Q4GEMM_SWIGLU=1); off by default: on
  // the H200 it measured slower than two launches + silu_mul at every T (kernel-bench "prefill
  // layer", T=512: 269 vs 229 us; T=4096: 2040 vs 1739)
  bool q4_fused_swiglu_ = false;
  // Split tail of the fused GEMM (kernels/gemm_q4_wgmma_ws.cuh): 16 MiB of f32 slices holds the
  // largest tail the Llama-3-8B shapes take at 512 rows (64 units x 2 splits x 256 x 128: o, down)
  static constexpr int64_t kSplitWsFloats = int64_t(4) << 20, kSplitTickets = 1024;
  // Allocated at the first fused GEMM (prompt chunks of 9-512 rows; never inside a captured step):
  // runs whose prompts all take another path do not hold it.
  mutable std::unique_ptr<CudaBuffer> split_ws_, split_tickets_;
  cuda::Q4SplitWs split_ws() const {
    if (!q4_gemm_fused_) return {};
    if (!split_ws_) {
      NF4FLASH_CHECK(!capturing_, "fused 4-bit GEMM: its split workspace must be allocated before graph capture");
      split_ws_ = std::make_unique<CudaBuffer>(size_t(kSplitWsFloats) * 4);
      split_tickets_ = std::make_unique<CudaBuffer>(size_t(kSplitTickets) * 4);
      CUDA_CHECK(cudaMemsetAsync(split_tickets_->data(), 0, split_tickets_->bytes(), stream_));
    }
    return {static_cast<float*>(split_ws_->data()), kSplitWsFloats, static_cast<int*>(split_tickets_->data()),
            kSplitTickets};
  }
  bool fused_q4_rows(int64_t rows) const { return q4_gemm_fused_ && rows > gemv_max_rows_ && rows <= q4_fused_max_rows_; }
  int64_t dequant_chunk_rows(const cuda::Q4Device& d, int64_t T) const {
    if (dequant_chunk_bytes_ <= 0 || T < kDequantChunkMinRows) return d.rows;
    const int64_t r = dequant_chunk_bytes_ / (d.cols * int64_t(dtype_size(act_))) / 16 * 16;
    return std::clamp<int64_t>(r, 16, d.rows);
  }
  void gemm_q4(const cuda::Q4Device& d, Act x, Act out);
  void gemm_q4_rows(const cuda::Q4Device& d, int64_t n0, int64_t nc, Act x, Act out, int64_t c0);
  bool gemm_q4_multi_args(Act x, const Weight* const* ws, int n, cuda::GemmQ4MultiArgs& a) const;
  std::unique_ptr<CudaBuffer> qs_partials_, qs_counters_;
  // Eager attention: the score buffer is sized outside graph capture (for this call and for a
  // captured decode step over the whole cache), never inside it.
  void attention_eager_run(const AttnArgs& a, int64_t pos0_host) {
    size_t need = attention_eager_plan(a, pos0_host).bytes;
    if (!capturing_) {
      AttnArgs d = a;
      d.T = std::min<int>(kDecodeMaxRows, int(a.capacity));
      need = std::max(need, attention_eager_plan(d, -1).bytes);
    }
    if (!eager_ws_ || eager_ws_->bytes() < need) {
      NF4FLASH_CHECK(!capturing_, "attention (eager): the score buffer (", need >> 20,
                     " MiB) must be allocated before graph capture; run an uncaptured step first");
      eager_ws_.reset();
      eager_ws_ = std::make_unique<CudaBuffer>(need);
    }
    attention_eager(a, pos0_host, cublas_, tf32_, eager_ws_->data(), eager_ws_->bytes(), stream_);
  }

  DType act_;
  bool tf32_;
  int q4_tile_group_ = 0;  // CudaBackendOptions::q4_tile_group (kernel-bench's layout experiment)
  int gemv_ablate_ = 0;    // CudaBackendOptions::gemv_ablate (kernel-bench's ablations; wrong results)
  cudaDeviceProp props_{};
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::unique_ptr<CudaBuffer> cublas_ws_, scratch_, attn_ws_, attn_cnt_, eager_ws_, sample_scratch_, k_cache_, v_cache_;
  std::unique_ptr<CudaBuffer> chain_cnt_;  // linear_chain's stage counters (zero between launches)
  std::unique_ptr<CudaBuffer> sk_slots_;   // opt-in stream-K GEMV's tagged partials (zero between launches)
  int sk_cap_ = 0;
  std::unique_ptr<CudaBuffer> sample_hist_;  // device copy of the sampling history (grown as needed)
  int64_t sample_vocab_ = -1;  // the vocabulary the sampling workspace is laid out for
  // pinned: the ids of sample_to_device()'s slots, then sample()'s; an event per slot
  int32_t* host_ids_ = nullptr;
  cudaEvent_t slot_ev_[kSampleSlots] = {};
  // sample()'s and sample_to_device()'s arguments: the parameters, the workspace (allocated or
  // re-laid out for this vocabulary outside capture) and, with the penalty, the history uploaded
  cuda::SampleArgs sample_args(Act logits, const SamplingParams& p, float uniform, const int32_t* history,
                               int n_history);
  KVCacheDesc kv_;
  std::vector<cudaGraphExec_t> graphs_;
  bool capturing_ = false;
  L2PrefetchPlan pf_;  // the L2 weight prefetch of captured steps (l2_prefetch_plan.h)
  // The in-order GEMV (kernels/gemv_q4_seq.cuh), with its prefetch descriptor while capturing.
  void seq_gemv(GemvQ4MultiArgs& a) {
    a.l2pf = pf_.add(L2PrefetchPlan::q4_desc(a));
    gemv_q4_seq(a, stream_);
  }
  // The 4-bit weight when `rows` rows take the in-order GEMV, else null.
  const CudaQ4* seq_q4(const Weight& w, int64_t rows) const {
    auto* q = dynamic_cast<const CudaQ4*>(&w);
    if (!q || q->fallback || act_ == DType::F32 || rows < 1 || rows > kGemvMaxRows || rows > gemv_max_rows_ ||
        !gemv_q4_seq_enabled())
      return nullptr;
    return q;
  }
};

}  // namespace nf4flash::cuda_impl
