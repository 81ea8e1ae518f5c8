// CudaBackend's steps over several sequences in the paged KV cache (StepState::paged): the cache
// allocation, attention (flash-decoding of the short sequences in one launch over their blocks,
// each prompt chunk through the prompt kernels over its sequence's blocks gathered), the gather of
// the rows that give logits, and the sampling of one token per row.
#include "backend/cuda/cuda_backend_impl.h"

namespace nf4flash::cuda_impl {

// The paged cache: per layer K and V [n_kv][n_blocks * block_size][hd] (the contiguous layout with
// n_blocks * block_size positions, so the kernels translate a position to its slot and nothing
// else changes). d.capacity is the longest sequence: it sizes the gather buffers of prompt chunks.
void CudaBackend::kv_allocate_paged(const KVCacheDesc& d, int64_t n_blocks, int block_size) {
  NF4FLASH_CHECK(n_blocks > 0 && block_size > 0, "paged KV cache: ", n_blocks, " blocks of ", block_size, " positions");
  NF4FLASH_CHECK(d.capacity > 0, "paged KV cache: the longest sequence must be given (capacity)");
  NF4FLASH_CHECK(n_blocks * block_size <= INT32_MAX, "paged KV cache: ", n_blocks, " blocks of ", block_size,
                 " positions exceed the kernels' 32-bit positions");
  KVCacheDesc p = d;
  p.capacity = n_blocks * block_size;
  kv_allocate(p);  // zero-filled: positions a kernel loads and masks are finite
  paged_ = true;
  block_size_ = block_size;
  gather_cap_ = (d.capacity + 127) / 128 * 128;  // whole 128-row TMA boxes of the wgmma kernel
  const size_t gb = size_t(d.n_kv_heads) * gather_cap_ * d.head_dim * dtype_size(d.dtype);
  gather_k_ = std::make_unique<CudaBuffer>(gb);
  gather_v_ = std::make_unique<CudaBuffer>(gb);
  CUDA_CHECK(cudaMemsetAsync(gather_k_->data(), 0, gb, stream_));
  CUDA_CHECK(cudaMemsetAsync(gather_v_->data(), 0, gb, stream_));
  sync();
}

PagedRows CudaBackend::paged_rows(const PagedSeqs& p) const {
  NF4FLASH_CHECK(paged_, "a step over several sequences needs the paged KV cache (kv_allocate_paged)");
  NF4FLASH_CHECK(p.n_seqs >= 1 && p.max_blocks >= 1 && p.row_start && p.pos0 && p.block_tables,
                 "paged step: ", p.n_seqs, " sequences, ", p.max_blocks, " blocks per table");
  PagedRows r;
  r.row_start = p.row_start;
  r.pos0 = p.pos0;
  r.tables = p.block_tables;
  r.n_seqs = p.n_seqs;
  r.max_blocks = p.max_blocks;
  r.block_size = block_size_;
  return r;
}

void CudaBackend::attention_paged(const AttnArgs& base, AttnImpl impl, const StepState& s) {
  const PagedSeqs& ps = *s.paged;
  const bool host = ps.row_start_host && ps.pos0_host;
  // without the host's view of the rows (a captured step) every row takes flash-decoding
  AttnArgs a = base;
  a.paged = paged_rows(ps);
  a.paged_max_rows = host ? kPagedDecodeRows : INT32_MAX;
  bool any_short = !host;
  if (host) {
    for (int i = 0; i < ps.n_seqs && !any_short; ++i)
      any_short = ps.row_start_host[i + 1] - ps.row_start_host[i] <= kPagedDecodeRows &&
                  ps.row_start_host[i + 1] > ps.row_start_host[i];
    NF4FLASH_CHECK(ps.row_start_host[0] == 0 && ps.row_start_host[ps.n_seqs] == base.T, "paged step: the ",
                   ps.n_seqs, " sequences' rows do not cover the step's ", base.T, " rows");
  }
  if (any_short) {
    const int64_t need = attention_paged_workspace_floats(a);
    if (!attn_ws_ || attn_ws_->bytes() < size_t(need) * 4) {
      NF4FLASH_CHECK(!capturing_, "attention (paged): the decode workspace must be sized before graph capture");
      renew_workspace(attn_ws_, size_t(need) * 4);
    }
    a.workspace = static_cast<float*>(attn_ws_->data());
    a.workspace_floats = int64_t(attn_ws_->bytes() / 4);
    attention_paged_decode(a, stream_);
  }
  if (!host) return;
  const size_t es = dtype_size(act_);
  for (int i = 0; i < ps.n_seqs; ++i) {
    const int r0 = ps.row_start_host[i], n = ps.row_start_host[i + 1] - r0;
    if (n <= kPagedDecodeRows) continue;
    const int len = ps.pos0_host[i] + n;
    NF4FLASH_CHECK(len <= gather_cap_, "attention (paged): sequence ", i, " reaches ", len,
                   " positions, past the longest sequence of the cache (", gather_cap_, ")");
    paged_gather_kv(base.k_cache, base.v_cache, kv_.capacity, a.paged, i, len, gather_k_->data(), gather_v_->data(),
                    gather_cap_, kv_.n_kv_heads, kv_.head_dim, kv_.dtype, stream_);
    AttnArgs b = base;
    b.q = static_cast<const char*>(base.q) + size_t(r0) * base.q_stride * es;
    b.out = static_cast<char*>(base.out) + size_t(r0) * base.out_stride * es;
    b.T = n;
    b.pos0 = ps.pos0 + i;
    b.k_cache = gather_k_->data();
    b.v_cache = gather_v_->data();
    b.capacity = gather_cap_;
    if (impl == AttnImpl::Flash) attention_flash(b, stream_);
    else if (impl == AttnImpl::Eager) attention_eager_run(b, ps.pos0_host[i]);
    else attention_prefill(b, stream_);
  }
}

void CudaBackend::gather_rows(Act x, const int32_t* rows, Act out) {
  NF4FLASH_CHECK(x.dtype == out.dtype && x.cols == out.cols, "gather_rows: x [", x.rows, ", ", x.cols, "] and out [",
                 out.rows, ", ", out.cols, "] differ");
  cuda::gather_rows(x.data, rows, out.data, out.rows, x.cols, dtype_size(x.dtype), stream_);
}

// Rows greedy without a penalty: one batched argmax over all rows; every other row: the sampling
// kernels of sample() one row after another, each id copied into place; then one copy to the host.
bool CudaBackend::sample_rows(Act logits, const SamplingParams* params, const std::vector<int32_t>* const* histories,
                              const float* uniforms, int32_t* out_ids_host) {
  NF4FLASH_CHECK(logits.dtype == DType::F32 && logits.rows >= 1, "sample_rows: logits must be F32 [n, vocab]");
  NF4FLASH_CHECK(!capturing_, "sample_rows: not capturable");
  const int64_t n = logits.rows, V = logits.cols;
  if (n > rows_cap_) {
    sync();
    if (rows_ids_host_) cudaFreeHost(rows_ids_host_);
    rows_ids_host_ = nullptr;
    rows_cap_ = std::max<int64_t>(n, 64);
    CUDA_CHECK(cudaMallocHost(&rows_ids_host_, size_t(rows_cap_) * 4));
    rows_ids_ = std::make_unique<CudaBuffer>(size_t(rows_cap_) * 4);
    rows_scratch_ = std::make_unique<CudaBuffer>(size_t(rows_cap_) * 2 * kArgmaxRowBlocks * 4);
  }
  int32_t* ids = static_cast<int32_t*>(rows_ids_->data());
  bool plain = false;
  for (int64_t i = 0; i < n && !plain; ++i) plain = params[i].greedy() && params[i].repeat_penalty == 1.0f;
  if (plain) argmax_rows(static_cast<const float*>(logits.data), n, V, rows_scratch_->data(), ids, stream_);
  for (int64_t i = 0; i < n; ++i) {
    const SamplingParams& p = params[i];
    if (p.greedy() && p.repeat_penalty == 1.0f) continue;
    const std::vector<int32_t>& h = *histories[i];
    const int32_t* dev_id = cuda::sample(
        sample_args(logits.slice_rows(i, 1), p, uniforms[i], h.data(), int(h.size())), stream_);
    CUDA_CHECK(cudaMemcpyAsync(ids + i, dev_id, 4, cudaMemcpyDeviceToDevice, stream_));
  }
  CUDA_CHECK(cudaMemcpyAsync(rows_ids_host_, ids, size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::copy(rows_ids_host_, rows_ids_host_ + n, out_ids_host);
  return true;
}

}  // namespace nf4flash::cuda_impl
