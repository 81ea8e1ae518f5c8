// Launcher of the dense multi-weight decode GEMV (kernels/gemv_dense_multi.cuh): q/k/v in one
// launch, gate+up with the SwiGLU epilogue in one launch.
#include <algorithm>

#include "backend/cuda/kernels/gemv_dense_multi.cuh"
#include "backend/cuda/kernels/gemv_q4_seq.cuh"  // gemv_num_sms

namespace nf4flash::cuda {

namespace {
// Row stride of x staged for the folded norm (16 bytes of padding: tokens start on other banks).
int dense_norm_x_stride(int64_t K) { return int(K * 2 + 16); }

// NORM: every block stages and normalizes x once, so the grid is what the GPU holds at once (each
// block then walks its units back to back) rather than one block per 8 units (H200, run 2 of the
// thirteenth session: 14 generations of blocks each paying the prologue made the folded norm a
// loss, bf16 decode 197 vs 204 tok/s).
template <typename TW, typename TA, int TN, bool SW, bool NORM>
void launch_dense_multi_t(const DenseMultiArgs& k, unsigned grid, cudaStream_t st) {
  // 8 chunks of 16 bytes in flight per lane: U per row, two rows per unit with SwiGLU
  constexpr int U = SW ? 4 : 8;
  auto kern = gemv_dense_multi_kernel<TW, TA, TN, SW, U, NORM>;
  const int smem = NORM ? k.T * k.x_stride : 0;
  if constexpr (NORM) {
    static const int per_sm = [&] {
      int v = 0;
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kern, 256, kDenseNormXMax));
      return std::max(v, 1);
    }();
    grid = std::min<unsigned>(grid, unsigned(per_sm * gemv_num_sms()));
  }
  launch_k(kern, dim3(grid), dim3(256), size_t(smem), st, k);
}

template <typename TW, typename TA, bool SW>
void launch_dense_multi(const DenseMultiArgs& k, cudaStream_t st) {
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>((k.units + 7) / 8, int64_t(gemv_num_sms()) * 64));
  if (k.norm_w) {
    if (k.T == 1) launch_dense_multi_t<TW, TA, 1, SW, true>(k, grid, st);
    else launch_dense_multi_t<TW, TA, kGemvMaxRows, SW, true>(k, grid, st);
  } else {
    if (k.T == 1) launch_dense_multi_t<TW, TA, 1, SW, false>(k, grid, st);
    else launch_dense_multi_t<TW, TA, kGemvMaxRows, SW, false>(k, grid, st);
  }
  CUDA_CHECK_LAUNCH();
}
}  // namespace

bool gemv_dense_multi_applies(const GemvDenseMultiArgs& g) {
  if (g.T < 1 || g.T > kGemvMaxRows || g.nseg < 1 || g.nseg > 3 || (g.swiglu && g.nseg != 2)) return false;
  if (g.K % 8 != 0 || reinterpret_cast<uintptr_t>(g.x) % 16 != 0) return false;
  if (dtype_size(g.w_dtype) != 2 || dtype_size(g.act) != 2) return false;
  for (int s = 0; s < g.nseg; ++s)
    if (reinterpret_cast<uintptr_t>(g.w[s]) % 16 != 0) return false;
  if (g.norm_w && (g.T * dense_norm_x_stride(g.K) > kDenseNormXMax || g.K / 8 > 1024)) return false;
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
  k.norm_w = g.norm_w;
  k.norm_eps = g.norm_eps;
  k.x_stride = dense_norm_x_stride(g.K);
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
