// Launchers of the mixture-of-experts kernels (kernels/moe.cuh).
#include <type_traits>

#include "backend/cuda/kernels/moe.cuh"

namespace nf4flash::cuda {

void moe_route(const MoeRouteArgs& a, cudaStream_t st) {
  if (a.T == 0) return;
  moe_route_kernel<<<1, 1024, 0, st>>>(a);
  CUDA_CHECK_LAUNCH();
}

void moe_gemv(const MoeGemvArgs& a, MoeKind kind, bool swiglu, int64_t max_chunks, int max_pairs, DType act,
              cudaStream_t st) {
  const int64_t units = max_chunks * a.m[0].RT;
  if (units == 0) return;
  // resident blocks: 256 threads of at most 128 registers leave 2 per SM
  const unsigned grid = unsigned(std::min<int64_t>(units, int64_t(device_sm_count()) * 2));
  NF4FLASH_DISPATCH_ACT(act, "moe_gemv", [&] {
    auto run = [&](auto kernel) { kernel<<<grid, kMoeWarps * 32, 0, st>>>(a); };
    // the one-row form for 4-bit experts at bf16/f16 (a decode step's speed); dense experts and f32
    // compute take the chunk form for one row too (the same arithmetic, fewer kernels to build)
    auto by_op = [&](auto tag) {
      constexpr MoeKind K = decltype(tag)::value;
      if constexpr (K != MoeKind::Dense && !std::is_same_v<T, float>) {
        if (max_pairs == 1) return swiglu ? run(moe_gemv_kernel<T, K, true, 1>) : run(moe_gemv_kernel<T, K, false, 1>);
      }
      swiglu ? run(moe_gemv_kernel<T, K, true, kMoeChunk>) : run(moe_gemv_kernel<T, K, false, kMoeChunk>);
    };
    switch (kind) {
      case MoeKind::Q4: by_op(std::integral_constant<MoeKind, MoeKind::Q4>{}); break;
      case MoeKind::Q4DoubleQuant: by_op(std::integral_constant<MoeKind, MoeKind::Q4DoubleQuant>{}); break;
      case MoeKind::Dense: by_op(std::integral_constant<MoeKind, MoeKind::Dense>{}); break;
    }
    CUDA_CHECK_LAUNCH();
  });
}

void moe_combine(const MoeCombineArgs& a, DType act, cudaStream_t st) {
  if (a.T == 0) return;
  const dim3 grid(unsigned((a.cols + 255) / 256), unsigned(a.T));
  NF4FLASH_DISPATCH_ACT(act, "moe_combine", [&] {
    moe_combine_kernel<T><<<grid, 256, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace nf4flash::cuda
