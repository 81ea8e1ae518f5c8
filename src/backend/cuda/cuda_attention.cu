// CudaBackend's rope, KV cache and attention: the argument structs of the kernels (with their shape
// checks; a paged step's rows attached), the KV cache allocation and the attention path of a step
// (paged steps: cuda_paged.cu): T <= kDecodeMaxRows rows take
// flash-decoding (attention_decode) for flash, sdpa and auto; more rows the flash kernel of the
// tuning (wgmma on Hopper, mma.sync elsewhere) or the CUDA-core "sdpa" kernel; eager materializes
// the scores with cuBLAS.
#include "backend/cuda/cuda_backend_impl.h"

namespace nf4flash::cuda_impl {

RopeArgs CudaBackend::rope_args(const Act& q, const Act& k, const RopeParams& p, const StepState& s) const {
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
  a.inv_freq_long = p.inv_freq_long;
  a.long_after = p.long_after;
  a.mscale = p.mscale;
  if (p.dynamic_table) {
    NF4FLASH_CHECK(p.dynamic_after > 0 && p.dynamic_theta > 0 && p.head_dim > 2, "rope: dynamic NTK scaling needs ",
                   "its original context, theta and a head_dim above 2");
    a.dynamic_after = p.dynamic_after;
    a.dynamic_theta = p.dynamic_theta;
    a.dynamic_factor = p.dynamic_factor;
  }
  a.pos0 = s.pos0;
  if (s.paged) a.paged = paged_rows(*s.paged);
  return a;
}

KvWriteArgs CudaBackend::kv_write_args(int layer, const Act& k, const Act& v, const StepState& s) const {
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
  NF4FLASH_CHECK(bool(s.paged) == paged_, paged_ ? "kv_write: the KV cache is paged: a step must give its sequences"
                                                 : "kv_write: a step over several sequences needs the paged KV cache");
  if (s.paged) a.paged = paged_rows(*s.paged);
  return a;
}

void CudaBackend::rope(Act q, Act k, const RopeParams& p, const StepState& s) {
  cuda::rope(rope_args(q, k, p, s), stream_);
}

void CudaBackend::kv_write(int layer, Act k, Act v, const StepState& s) {
  cuda::kv_write(kv_write_args(layer, k, v, s), stream_);
}

void CudaBackend::rope_kv_write(int layer, Act q, Act k, Act v, const RopeParams& p, const StepState& s,
                                const QkNorm& qk) {
  RopeArgs r = rope_args(q, k, p, s);
  if (qk.q && !cuda::rope_norm_fusable(p.head_dim)) {
    qk_norm(q, k, p.head_dim, qk);  // the norms as their own launches
  } else if (qk.q) {
    NF4FLASH_CHECK(qk.k, "q/k norms: both weights are needed");
    r.q_norm = vec_f32(*qk.q, p.head_dim, "q norm weight");
    r.k_norm = vec_f32(*qk.k, p.head_dim, "k norm weight");
    r.norm_eps = qk.eps;
  }
  cuda::rope_kv_write(r, kv_write_args(layer, k, v, s), stream_);
}

void CudaBackend::attention(int layer, Act q, Act out, const AttnParams& p, const StepState& s) {
  const AttnArgs a = attn_args(layer, q, out, p, s);
  const AttnImpl impl = resolve_attn(p.impl);
  if (s.paged) attention_paged(a, impl, s);
  else if (impl == AttnImpl::Eager) attention_eager_run(a, capturing_ ? -1 : s.pos0_host);
  else if (a.T <= kDecodeMaxRows) attention_decode(a, stream_);
  else if (impl == AttnImpl::Flash) attention_flash(a, stream_);
  else attention_prefill(a, stream_);
}

// The arguments of every attention kernel; decode's split workspace attached.
AttnArgs CudaBackend::attn_args(int layer, const Act& q, const Act& out, const AttnParams& p, const StepState& s) {
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
  a.softcap = p.softcap;
  NF4FLASH_CHECK(p.window >= 0 && p.window <= INT32_MAX, "attention: window ", p.window);
  a.window = int(p.window);
  a.pos0 = s.pos0;
  a.num_sms = props_.multiProcessorCount;
  a.flash = flash_kernel_;
  if (s.paged) {
    NF4FLASH_CHECK(paged_, "attention: a step over several sequences needs the paged KV cache (kv_allocate_paged)");
    return a;  // attention_paged sizes its workspace
  }
  NF4FLASH_CHECK(!paged_, "attention: the KV cache is paged: a step must give its sequences (StepState::paged)");
  if (a.T <= kDecodeMaxRows) {
    const int64_t need = attention_decode_workspace_floats(kDecodeMaxRows, p.n_heads, p.head_dim);
    if (!attn_ws_ || attn_ws_->bytes() < size_t(need) * 4) {
      NF4FLASH_CHECK(!capturing_, "attention: decode workspace must be sized before graph capture");
      renew_workspace(attn_ws_, size_t(need) * 4);
    }
    a.workspace = static_cast<float*>(attn_ws_->data());
    a.workspace_floats = need;
  }
  return a;
}

// Eager attention: the score buffer is sized outside graph capture (for this call and for a
// captured decode step over the whole cache), never inside it.
void CudaBackend::attention_eager_run(const AttnArgs& a, int64_t pos0_host) {
  size_t need = attention_eager_plan(a, pos0_host).bytes;
  if (!capturing_) {
    AttnArgs d = a;
    d.T = std::min<int>(kDecodeMaxRows, int(a.capacity));
    need = std::max(need, attention_eager_plan(d, -1).bytes);
  }
  if (!eager_ws_ || eager_ws_->bytes() < need) {
    NF4FLASH_CHECK(!capturing_, "attention (eager): the score buffer (", need >> 20,
                   " MiB) must be allocated before graph capture; run an uncaptured step first");
    renew_workspace(eager_ws_, need);
  }
  attention_eager(a, pos0_host, cublas_, tf32_, eager_ws_->data(), eager_ws_->bytes(), stream_);
}

void CudaBackend::kv_allocate(const KVCacheDesc& d) {
  ++kv_epoch_;
  NF4FLASH_CHECK(d.dtype == DType::F32 || d.dtype == DType::BF16 || d.dtype == DType::F16,
                 "KV cache dtype ", dtype_name(d.dtype), " not supported on CUDA");
  k_cache_.reset();
  v_cache_.reset();
  gather_k_.reset();
  gather_v_.reset();
  paged_ = false;
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
  sync();
}

std::string CudaBackend::attn_unsupported_reason(AttnImpl impl, int head_dim) const {
  if (!attention_head_dim_supported(head_dim))
    return cat("unsupported head_dim ", head_dim, " for the CUDA attention kernels; supported: 32, 64, 80, 96, 128, 256");
  // flash needs the KV cache in the compute dtype: the engine allocates it so (checked per call too)
  if (impl == AttnImpl::Flash) return attention_flash_unsupported(act_, act_, head_dim);
  return "";
}

// Auto: flash where it serves (bf16/f16 compute), else sdpa.
AttnImpl CudaBackend::resolve_attn(AttnImpl impl) const {
  if (impl != AttnImpl::Auto) return impl;
  return attention_flash_unsupported(act_, act_, 128).empty() ? AttnImpl::Flash : AttnImpl::Sdpa;
}

std::string CudaBackend::attn_path(AttnImpl impl) const {
  if (impl != AttnImpl::Flash) return std::string(attn_impl_name(impl));
  // the Hopper kernel runs head_dim 64, 128 and 256 (the KV cache's, once allocated)
  const bool wgmma = flash_kernel_ == FlashKernel::Wgmma && (kv_.head_dim == 0 || attention_flash_wgmma_head_dim(kv_.head_dim));
  return wgmma ? "flash (wgmma)" : "flash (mma.sync)";
}

}  // namespace nf4flash::cuda_impl
