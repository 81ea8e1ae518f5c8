// The CUDA Backend: one device, one non-blocking stream, plain cudaMalloc per buffer, cuBLAS for
// many-row products, CUDA graphs over the stream (class in cuda_backend_impl.h, linear dispatch in
// cuda_linear.cu). Every CUDA/cuBLAS call is checked with file:line. This file: the factory and
// sampling (synchronous, and the pipelined decode loop's sample_to_device).
#include "backend/cuda/cuda_backend_impl.h"

namespace nf4flash {

namespace cuda_impl {

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
