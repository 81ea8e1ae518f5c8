// Launchers of the sampling kernels (kernels/sample.cuh: greedy argmax; kernels/sample_topk.cuh:
// penalty, temperature, top-k, top-p, min-p and the draw).
#include "backend/cuda/kernels/sample.cuh"
#include "backend/cuda/kernels/sample_topk.cuh"

#include <algorithm>

namespace nf4flash::cuda {

void argmax(const float* logits, int64_t vocab, const int32_t* history, int n_history, float repeat_penalty,
            void* scratch, int32_t* out_id, cudaStream_t st) {
  float* pv = static_cast<float*>(scratch);
  int* pi = reinterpret_cast<int*>(pv + kArgmaxBlocks);
  if (repeat_penalty != 1.f && n_history > 0 && history) {
    launch_k(argmax_partial_penalty_kernel, dim3(kArgmaxBlocks), dim3(256), 0, st, logits, vocab, history, n_history,
             repeat_penalty, pv, pi);
  } else {
    launch_k(argmax_partial_kernel, dim3(kArgmaxBlocks), dim3(256), 0, st, logits, vocab, pv, pi);
  }
  CUDA_CHECK_LAUNCH();
  launch_k(argmax_final_kernel, dim3(1), dim3(256), 0, st, pv, pi, kArgmaxBlocks, out_id);
  CUDA_CHECK_LAUNCH();
}

void argmax_rows(const float* logits, int64_t n, int64_t vocab, void* scratch, int32_t* out_ids, cudaStream_t st) {
  NF4FLASH_CHECK(n >= 0 && n <= 65535, "argmax_rows: ", n, " rows");
  if (n == 0) return;
  float* pv = static_cast<float*>(scratch);
  int* pi = reinterpret_cast<int*>(pv + n * kArgmaxRowBlocks);
  argmax_rows_partial_kernel<<<dim3(kArgmaxRowBlocks, unsigned(n)), 256, 0, st>>>(logits, vocab, pv, pi);
  CUDA_CHECK_LAUNCH();
  argmax_rows_final_kernel<<<unsigned(n), 256, 0, st>>>(pv, pi, kArgmaxRowBlocks, out_ids);
  CUDA_CHECK_LAUNCH();
}

void decode_advance(const int32_t* id, int32_t* next_id, int32_t* pos, int32_t* hist, int32_t* hist_count,
                    int hist_cap, cudaStream_t st) {
  NF4FLASH_CHECK(!hist || (hist_count && hist_cap > 0), "decode_advance: a history needs its count and capacity");
  launch_k(decode_advance_kernel, dim3(1), dim3(32), 0, st, id, next_id, pos, hist, hist_count, hist_cap);
  CUDA_CHECK_LAUNCH();
}

size_t sample_workspace_bytes(int64_t vocab) { return sample_ws_layout(nullptr, vocab, nullptr); }

const int32_t* sample(const SampleArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(a.logits && a.vocab > 0, "sample: empty logits");
  NF4FLASH_CHECK(a.vocab <= kSampleMaxVocab, "sample: vocabulary of ", a.vocab,
                 " tokens is larger than the CUDA sampler supports (", kSampleMaxVocab, ")");
  NF4FLASH_CHECK(a.workspace && a.workspace_bytes >= sample_workspace_bytes(a.vocab),
                 "sample: workspace of ", a.workspace_bytes, " bytes, need ", sample_workspace_bytes(a.vocab));
  NF4FLASH_CHECK(a.top_k >= 0 && a.top_p > 0.f && a.top_p <= 1.f && a.min_p >= 0.f && a.min_p <= 1.f &&
                     a.repeat_penalty > 0.f && a.uniform >= 0.f && a.uniform < 1.f,
                 "sample: parameters out of range (top_k ", a.top_k, ", top_p ", a.top_p, ", min_p ", a.min_p,
                 ", repeat_penalty ", a.repeat_penalty, ", uniform ", a.uniform, ")");
  SampleKArgs k{};
  sample_ws_layout(a.workspace, a.vocab, &k.ws);
  k.logits = a.logits;
  k.V = static_cast<int>(a.vocab);
  k.hist = a.history;
  k.nh = a.repeat_penalty != 1.f && a.history ? a.n_history : 0;
  k.nh_dev = k.nh > 0 ? a.history_count : nullptr;
  k.pen = a.repeat_penalty;
  k.top_p = a.top_p;
  k.min_p = a.min_p;
  k.u = a.uniform;
  k.top_k = a.top_k;
  const bool greedy = !(a.temperature > 0.f);
  k.T = greedy ? 1.f : a.temperature;
  auto prep = [&] {
    if (k.nh > 0) {
      const int blocks = std::min((k.nh + 255) / 256, 64);
      launch_k(sample_mark_kernel, dim3(blocks), dim3(256), 0, st, k);
      CUDA_CHECK_LAUNCH();
    }
    launch_k(sample_prep_kernel, dim3(kSamplePrepBlocks), dim3(256), 0, st, k, k.nh > 0);
    CUDA_CHECK_LAUNCH();
  };
  if (greedy) {  // argmax after the penalty (first index on ties)
    if (k.nh > 0) prep();
    argmax(k.nh > 0 ? k.ws.s : a.logits, a.vocab, nullptr, 0, 1.f, k.ws.amax, k.ws.out, st);
    return k.ws.out;
  }
  prep();
  constexpr size_t smem = sizeof(SelSmem);
  auto single = [&](auto kernel) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    launch_k(kernel, dim3(1), dim3(kSelThreads), smem, st, k);
    CUDA_CHECK_LAUNCH();
  };
  const bool top_k = a.top_k > 0 && a.top_k < a.vocab;
  if (top_k && a.top_k <= kGather) {
    single(sample_small_kernel);
    return k.ws.out;
  }
  if (top_k) single(sample_topk_kernel);
  launch_k(sample_weights_kernel, dim3(kSamplePrepBlocks), dim3(256), 0, st, k, top_k);
  CUDA_CHECK_LAUNCH();
  single(sample_final_kernel);
  return k.ws.out;
}

}  // namespace nf4flash::cuda
