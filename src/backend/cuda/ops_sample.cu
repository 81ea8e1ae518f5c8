// Launchers of the sampling kernels (kernels/sample.cuh).
#include "backend/cuda/kernels/sample.cuh"

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

}  // namespace nf4flash::cuda
