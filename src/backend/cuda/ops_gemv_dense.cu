// Launchers of the dense decode GEMVs: one weight (kernels/gemv_dense.cuh: the 16-byte vector kernel,
// or the scalar one for other dtypes and alignments) and up to three weights sharing x
// (kernels/gemv_dense_multi.cuh: q/k/v in one launch, gate+up with the SwiGLU epilogue).
#include <algorithm>

#include "backend/cuda/kernels/gemv_dense.cuh"
#include "backend/cuda/kernels/gemv_dense_multi.cuh"

namespace nf4flash::cuda {

namespace {
template <typename TW, typename TA, int TN, bool SW>
void launch_dense_multi_t(const DenseMultiArgs& k, unsigned grid, cudaStream_t st) {
  // 8 chunks of 16 bytes in flight per lane: U per row, two rows per unit with SwiGLU
  constexpr int U = SW ? 4 : 8;
  launch_k(gemv_dense_multi_kernel<TW, TA, TN, SW, U>, dim3(grid), dim3(256), 0, st, k);
}

template <typename TW, typename TA, bool SW>
void launch_dense_multi(const DenseMultiArgs& k, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((k.units + 7) / 8, int64_t(device_sm_count()) * 64));
  if (k.T == 1) launch_dense_multi_t<TW, TA, 1, SW>(k, grid, st);
  else launch_dense_multi_t<TW, TA, kGemvMaxRows, SW>(k, grid, st);
  CUDA_CHECK_LAUNCH();
}

template <typename TW, typename TA>
void launch_dense(const GemvDenseArgs& g, cudaStream_t st) {
  DenseKernelArgs a{g.w, g.N, g.K, g.x, g.T, g.bias, g.out, g.out_dtype == DType::F32};
  const int64_t want = (g.N + 7) / 8;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(want, int64_t(device_sm_count()) * 64));
  constexpr bool vec16 = sizeof(TW) == 2 && sizeof(TA) == 2;
  const bool aligned = (g.K % 8 == 0) && (reinterpret_cast<uintptr_t>(g.w) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(g.x) % 16 == 0);
  if (vec16 && aligned) {
    if (g.T == 1) launch_k(gemv_dense_vec_kernel<TW, TA, 1>, dim3(grid), dim3(256), 0, st, a);
    else launch_k(gemv_dense_vec_kernel<TW, TA, kGemvMaxRows>, dim3(grid), dim3(256), 0, st, a);
  } else {
    launch_k(gemv_dense_scalar_kernel<TW, TA>, dim3(grid), dim3(256), 0, st, a);
  }
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void gemv_dense(const GemvDenseArgs& g, cudaStream_t st) {
  NF4FLASH_CHECK(g.T >= 1 && g.T <= kGemvMaxRows, "gemv_dense: T=", g.T, " outside 1..", kGemvMaxRows);
  NF4FLASH_DISPATCH_ACT(g.act, "gemv_dense (activations)", [&] {
    using TA = T;
    NF4FLASH_DISPATCH_ACT(g.w_dtype, "gemv_dense (weight)", [&] { launch_dense<T, TA>(g, st); });
  });
}

bool gemv_dense_multi_applies(const GemvDenseMultiArgs& g) {
  if (g.T < 1 || g.T > kGemvMaxRows || g.nseg < 1 || g.nseg > 3 || (g.swiglu && g.nseg != 2)) return false;
  if (g.K % 8 != 0 || reinterpret_cast<uintptr_t>(g.x) % 16 != 0) return false;
  if (dtype_size(g.w_dtype) != 2 || dtype_size(g.act) != 2) return false;
  for (int s = 0; s < g.nseg; ++s)
    if (reinterpret_cast<uintptr_t>(g.w[s]) % 16 != 0) return false;
  return !g.swiglu || g.N[0] == g.N[1];
}

void gemv_dense_multi(const GemvDenseMultiArgs& g, cudaStream_t st) {
  NF4FLASH_CHECK(gemv_dense_multi_applies(g), "gemv_dense_multi: unsupported arguments (T=", g.T, ", ", g.nseg,
                 " weights, K=", g.K, ")");
  DenseMultiArgs k{};
  int64_t end = 0;
  for (int s = 0; s < g.nseg; ++s) {
    k.w[s] = g.w[s];
    k.bias[s] = g.bias[s];
    k.out[s] = g.out[s];
    end += g.N[s];
    k.unit_end[s] = end;
  }
  k.units = g.swiglu ? g.N[0] : end;
  k.K = g.K;
  k.x = g.x;
  k.nseg = g.nseg;
  k.T = g.T;
  k.out_f32 = g.out_dtype == DType::F32;
  NF4FLASH_CHECK(!g.swiglu || !k.out_f32, "gemv_dense_multi: the SwiGLU output is in the compute dtype");
  NF4FLASH_DISPATCH_ACT(g.act, "gemv_dense_multi (activations)", [&] {
    using TA = T;
    NF4FLASH_DISPATCH_ACT(g.w_dtype, "gemv_dense_multi (weight)", [&] {
      using TW = T;
      if constexpr (sizeof(TW) == 2 && sizeof(TA) == 2) {
        if (g.swiglu) launch_dense_multi<TW, TA, true>(k, st);
        else launch_dense_multi<TW, TA, false>(k, st);
      }
    });
  });
}

}  // namespace nf4flash::cuda
