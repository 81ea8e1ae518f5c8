// The CUDA Backend (class in cuda_backend_impl.h): construction from its tuning, memory, graphs,
// sampling (synchronous, and the pipelined decode loop's sample_to_device) and the factory.
#include <algorithm>
#include <climits>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "core/thread_pool.h"

namespace nf4flash {

namespace cuda_impl {

namespace {

// Whether a kernel choice (NF4FLASH_FLASH_KERNEL, NF4FLASH_Q4_SKINNY_KERNEL) takes the wgmma
// kernel: where it runs (auto), always (wgmma: an error naming `var` where it cannot), or never.
bool wgmma_chosen(MmaKernelChoice c, bool supported, bool built, const char* var, const cudaDeviceProp& p) {
  switch (c) {
    case MmaKernelChoice::Auto: return supported;
    case MmaKernelChoice::Mma: return false;
    case MmaKernelChoice::Wgmma: break;
  }
  NF4FLASH_CHECK(supported, var, "=wgmma: needs a compute capability 9.0 GPU and a build for sm_90a (this: ", p.major,
                 ".", p.minor, built ? "" : ", built without sm_90a", ")");
  return true;
}

}  // namespace

CudaBackend::CudaBackend(const CudaBackendOptions& o)
    : act_(o.compute), tf32_(o.tf32), tuning_(o.tuning ? *o.tuning : cuda_tuning_current()) {
  NF4FLASH_CHECK(act_ == DType::BF16 || act_ == DType::F16 || act_ == DType::F32,
                 "--compute-dtype: ", dtype_name(act_), " is not supported on CUDA (bf16, f16, f32)");
  NF4FLASH_CHECK(tuning_.gemv_max_rows >= 0 && tuning_.gemv_max_rows <= 256 && tuning_.q4_fused_max_rows >= 0 &&
                     tuning_.q4_skinny_max_rows >= 0 && tuning_.q4_skinny_max_rows <= kQ4SkinnyMaxRows &&
                     tuning_.dequant_chunk_mb >= 0 && tuning_.stack_bytes >= 0,
                 "CudaTuning: a row count or size is out of range");
  set_pdl_requested(tuning_.pdl);
  vram_trace_on().store(tuning_.vram_trace);
  CUDA_CHECK(cudaSetDevice(o.device_index));
  CUDA_CHECK(cudaFree(nullptr));  // the context now, so the trace below separates it
  vram_trace("context");
  CUDA_CHECK(cudaGetDeviceProperties(&props_, o.device_index));
  // Per-thread stack: the driver reserves limit x resident threads of local memory (1 KiB x 2048 x
  // 132 SMs = 277 MB on an H200 by default). Our kernels need none; the driver raises the limit at
  // the launch of any kernel (ours or a library's) that needs more ("the driver automatically
  // increases the per-thread stack size for each kernel launch as needed", cuCtxSetLimit), so 0
  // reserves only what the kernels actually run need (H200 peak VRAM at ctx 8192: 6.47 -> 6.28 GiB
  // for 256 bytes).
  CUDA_CHECK(cudaDeviceSetLimit(cudaLimitStackSize, size_t(tuning_.stack_bytes)));
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  vram_trace("stack limit + stream");
  CUBLAS_CHECK(cublas().create(&cublas_));
  vram_trace("cublasCreate");
  CUBLAS_CHECK(cublas().set_stream(cublas_, stream_));
  cublas_ws_ = std::make_unique<CudaBuffer>(size_t(32) << 20);
  CUBLAS_CHECK(cublas().set_workspace(cublas_, cublas_ws_->data(), cublas_ws_->bytes()));
  CUBLAS_CHECK(cublas().set_math_mode(cublas_, tf32_ ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  dequant_chunk_bytes_ = int64_t(tuning_.dequant_chunk_mb) << 20;
  // 4-bit products above the GEMV rows: the fused wgmma GEMM up to q4_fused_max_rows rows where it
  // can run (auto), always (fused: an error where it cannot), or never (dequant)
  const bool fused_ok = act_ != DType::F32 && gemm_q4_wgmma_supported();
  q4_gemm_fused_ = fused_ok && tuning_.q4_gemm != Q4GemmMode::Dequant;
  q4_fused_max_rows_ = tuning_.q4_fused_max_rows;
  // the skinny GEMM where its shared-memory ring fits a block (not on GPUs with 99 KiB per block)
  q4_skinny_max_rows_ = std::min<int64_t>(tuning_.q4_skinny_max_rows, gemm_q4_skinny_max_rows(props_.sharedMemPerBlockOptin));
  // its wgmma form at 17..32 rows
  q4_skinny_wgmma_ = wgmma_chosen(tuning_.q4_skinny_kernel, gemm_q4_skinny_wgmma_supported(), gemm_q4_wgmma_built(),
                                  "NF4FLASH_Q4_SKINNY_KERNEL", props_);
  if (tuning_.q4_gemm == Q4GemmMode::Fused) {
    NF4FLASH_CHECK(fused_ok, "NF4FLASH_Q4_GEMM=fused: the fused 4-bit GEMM needs bf16/f16 compute, a build for "
                   "sm_90a and a compute capability 9.0 GPU (this: ", props_.major, ".", props_.minor,
                   gemm_q4_wgmma_built() ? "" : ", built without sm_90a", ")");
    q4_fused_max_rows_ = INT64_MAX;
  }
  if (!q4_gemm_fused_) q4_fused_max_rows_ = 0;
  flash_kernel_ = wgmma_chosen(tuning_.flash_kernel, attention_flash_wgmma_supported(), attention_flash_wgmma_built(),
                               "NF4FLASH_FLASH_KERNEL", props_)
                      ? FlashKernel::Wgmma
                      : FlashKernel::Mma;
  CUDA_CHECK(cudaMallocHost(&host_ids_, sizeof(int32_t) * (kSampleSlots + 1)));
  for (auto& e : slot_ev_) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

CudaBackend::~CudaBackend() {
  for (auto e : graphs_) cudaGraphExecDestroy(e);
  for (auto e : slot_ev_)
    if (e) cudaEventDestroy(e);
  if (host_ids_) cudaFreeHost(host_ids_);
  if (rows_ids_host_) cudaFreeHost(rows_ids_host_);
  if (cublas_) cublas().destroy(cublas_);
  for (auto e : staging_ev_)
    if (e) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
}

// ---- memory ----
// Large copies (weights at load, from the checkpoint's mapped pages) go through two pinned staging
// buffers: the host threads copy chunk i + 1 into one while the DMA engine copies chunk i from the
// other. A pageable cudaMemcpy of a mapped file runs at the speed of one host thread.
void CudaBackend::upload(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  constexpr size_t kChunk = size_t{64} << 20, kPiece = size_t{2} << 20;
  if (bytes < 2 * kPiece) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  if (!staging_[0]) {
    for (int i = 0; i < 2; ++i) {
      staging_[i] = std::make_unique<CudaHostBuffer>(kChunk);
      CUDA_CHECK(cudaEventCreateWithFlags(&staging_ev_[i], cudaEventDisableTiming));
    }
  }
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t off = 0, i = 0; off < bytes; off += kChunk, ++i) {
    const size_t n = std::min(kChunk, bytes - off);
    uint8_t* stage = static_cast<uint8_t*>(staging_[i % 2]->data());
    CUDA_CHECK(cudaEventSynchronize(staging_ev_[i % 2]));  // its previous copy is done
    thread_pool().parallel_for(static_cast<int64_t>((n + kPiece - 1) / kPiece), 1, [&](int64_t p0, int64_t p1) {
      const size_t b = static_cast<size_t>(p0) * kPiece, e = std::min(n, static_cast<size_t>(p1) * kPiece);
      std::memcpy(stage + b, s + off + b, e - b);
    });
    CUDA_CHECK(cudaMemcpyAsync(d + off, stage, n, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaEventRecord(staging_ev_[i % 2], stream_));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::download(void* dst, const void* src, size_t bytes) {
  if (!bytes) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

size_t CudaBackend::free_memory() const {
  size_t f = 0, t = 0;
  CUDA_CHECK(cudaMemGetInfo(&f, &t));
  return f;
}

// ---- graphs ----
void CudaBackend::capture_begin() {
  NF4FLASH_CHECK(!capturing_, "capture_begin: already capturing");
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
}

int CudaBackend::capture_end() {
  NF4FLASH_CHECK(capturing_, "capture_end without capture_begin");
  capturing_ = false;
  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
  cudaGraphExec_t e = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  CUDA_CHECK(cudaGraphDestroy(g));
  graphs_.push_back(e);
  return int(graphs_.size()) - 1;
}

void CudaBackend::replay(int id) {
  NF4FLASH_CHECK(id >= 0 && size_t(id) < graphs_.size(), "replay: unknown graph ", id);
  CUDA_CHECK(cudaGraphLaunch(graphs_[size_t(id)], stream_));
}

// ---- sampling ----

cuda::SampleArgs CudaBackend::sample_args(Act logits, const SamplingParams& p, float uniform, const int32_t* history,
                                          int n_history) {
  NF4FLASH_CHECK(logits.dtype == DType::F32 && logits.rows == 1, "sample: logits must be F32 [1, vocab]");
  NF4FLASH_CHECK(!capturing_, "sample: not capturable");
  cuda::SampleArgs a;
  a.logits = static_cast<const float*>(logits.data);
  a.vocab = logits.cols;
  a.temperature = p.temperature;
  a.top_k = p.top_k;
  a.top_p = p.top_p;
  a.min_p = p.min_p;
  a.repeat_penalty = p.repeat_penalty;
  a.uniform = p.greedy() ? 0.0f : uniform;
  const size_t ws = cuda::sample_workspace_bytes(a.vocab);
  if (!sample_scratch_ || sample_scratch_->bytes() < ws || sample_vocab_ != a.vocab) {
    if (!sample_scratch_ || sample_scratch_->bytes() < ws) {
      sync();  // a queued step may still sample into the old workspace
      sample_scratch_.reset();
      sample_scratch_ = std::make_unique<CudaBuffer>(ws);
    }
    // the history marks start at zero; their place depends on the vocabulary (the layout)
    CUDA_CHECK(cudaMemsetAsync(sample_scratch_->data(), 0, sample_scratch_->bytes(), stream_));
    sample_vocab_ = a.vocab;
  }
  a.workspace = sample_scratch_->data();
  a.workspace_bytes = sample_scratch_->bytes();
  if (p.repeat_penalty != 1.0f && n_history > 0 && history) {
    const size_t hb = size_t(n_history) * sizeof(int32_t);
    if (!sample_hist_ || sample_hist_->bytes() < hb) {
      sync();  // the previous history may still be read
      sample_hist_.reset();
      sample_hist_ = std::make_unique<CudaBuffer>(std::max<size_t>(hb * 2, 4096));
    }
    CUDA_CHECK(cudaMemcpyAsync(sample_hist_->data(), history, hb, cudaMemcpyHostToDevice, stream_));
    a.history = static_cast<const int32_t*>(sample_hist_->data());
    a.n_history = n_history;
  }
  return a;
}

bool CudaBackend::sample(Act logits, const SamplingParams& p, const int32_t* history, int n_history, float uniform,
                         int32_t* out_id_host) {
  const int32_t* dev_id = cuda::sample(sample_args(logits, p, uniform, history, n_history), stream_);
  int32_t* h = host_ids_ + kSampleSlots;
  CUDA_CHECK(cudaMemcpyAsync(h, dev_id, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  *out_id_host = *h;
  return true;
}

// The sampling kernels, the hand-over to the next step (decode_advance) and the id's copy to its
// pinned slot, all queued: nothing here waits for the device.
bool CudaBackend::sample_to_device(Act logits, const SamplingParams& p, float uniform, int32_t* next_id, int32_t* pos,
                                   int slot, int32_t* history, int32_t* history_count, int history_capacity) {
  NF4FLASH_CHECK(slot >= 0 && slot < kSampleSlots, "sample_to_device: slot ", slot, " out of range");
  NF4FLASH_CHECK(p.repeat_penalty == 1.0f || (history && history_count && history_capacity > 0),
                 "sample_to_device: the repetition penalty needs the history in device memory");
  NF4FLASH_CHECK(next_id && pos, "sample_to_device: no next-id or position buffer");
  cuda::SampleArgs a = sample_args(logits, p, uniform, nullptr, 0);
  if (history) {  // the history and its count stay on the device (cuda::sample reads it only with a penalty)
    a.history = history;
    a.n_history = history_capacity;
    a.history_count = history_count;
  }
  const int32_t* dev_id = cuda::sample(a, stream_);
  cuda::decode_advance(dev_id, next_id, pos, history, history_count, history_capacity, stream_);
  CUDA_CHECK(cudaMemcpyAsync(host_ids_ + slot, dev_id, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaEventRecord(slot_ev_[slot], stream_));
  return true;
}

int32_t CudaBackend::sampled(int slot) {
  NF4FLASH_CHECK(slot >= 0 && slot < kSampleSlots, "sampled: slot ", slot, " out of range");
  CUDA_CHECK(cudaEventSynchronize(slot_ev_[slot]));
  return host_ids_[slot];
}

}  // namespace cuda_impl

using cuda_impl::CudaBackend;

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& o) {
  const int n = cuda_device_count();
  NF4FLASH_CHECK(n > 0, "--device cuda: no usable CUDA device (driver missing or no GPU)");
  NF4FLASH_CHECK(o.device_index >= 0 && o.device_index < n, "--device cuda: device index ", o.device_index,
                 " out of range (", n, " devices)");
  return std::make_unique<CudaBackend>(o);
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace nf4flash
