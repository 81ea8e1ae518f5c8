// Launchers of the GEMV kernels (4-bit fused and dense) and of the 4-bit repack/dequantize kernels.
#include <cstdlib>
#include <string_view>

#include "backend/cuda/kernels/gemv_dense.cuh"
#include "backend/cuda/kernels/gemv_q4.cuh"

namespace nf4flash::cuda {

namespace {
int num_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// Default: the register-prefetch kernel. NF4FLASH_GEMV_Q4=async selects the cp.async ring variant
// (kernel-bench times both; on the H200, 2026-12-02 run 5, async was 1.3-1.5x slower: 28.1 vs
// 18.2 us on nf4-dq 4096x14336, and decode 189 vs 232 tok/s end to end).
bool gemv_q4_use_async() {
  const char* v = std::getenv("NF4FLASH_GEMV_Q4");
  return v && std::string_view(v) == "async";
}

template <typename TA, bool DQ>
void launch_q4(const GemvQ4Args& g, cudaStream_t st) {
  Q4KernelArgs a{*g.w, g.x, g.T, g.bias, g.out, g.out_dtype == DType::F32};
  const bool async = gemv_q4_use_async();
  auto kernel = async ? gemv_q4_async_kernel<TA, DQ> : gemv_q4_kernel<TA, DQ>;
  const int dyn = async ? kQ4AsyncRingBytes : 0;
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(gemv_q4_async_kernel<TA, DQ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kQ4AsyncRingBytes));
    attr_set = true;
  }
  int grid = g.grid;
  if (grid <= 0) {
    static int per_sm[2] = {0, 0};
    int& ps = per_sm[async ? 1 : 0];
    if (ps == 0) {
      CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ps, kernel, kQ4Warps * 32, dyn));
      if (ps <= 0) ps = 1;
    }
    grid = static_cast<int>(std::min<int64_t>(g.w->RT, int64_t(ps) * num_sms()));
  }
  kernel<<<grid, kQ4Warps * 32, dyn, st>>>(a);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void q4_repack(const uint8_t* packed_dev, int64_t rows, int64_t cols, uint8_t* tiles_dev, cudaStream_t st) {
  const int64_t RT = (rows + 15) / 16, KT = cols / 64, n_words = RT * KT * 128;
  const int threads = 256;
  q4_repack_kernel<<<static_cast<unsigned>((n_words + threads - 1) / threads), threads, 0, st>>>(
      packed_dev, rows, cols, KT, n_words, reinterpret_cast<uint32_t*>(tiles_dev));
  CUDA_CHECK_LAUNCH();
}

void gemv_q4(const GemvQ4Args& g, cudaStream_t st) {
  NF4FLASH_CHECK(g.T >= 1 && g.T <= kGemvMaxRows, "gemv_q4: T=", g.T, " outside 1..", kGemvMaxRows);
  if (g.act == DType::BF16) {
    if (g.w->double_quant) launch_q4<__nv_bfloat16, true>(g, st);
    else launch_q4<__nv_bfloat16, false>(g, st);
  } else if (g.act == DType::F16) {
    if (g.w->double_quant) launch_q4<__half, true>(g, st);
    else launch_q4<__half, false>(g, st);
  } else {
    fail("gemv_q4: compute dtype ", dtype_name(g.act), " not supported by the fused 4-bit GEMV (bf16/f16)");
  }
}

void q4_dequant(const Q4Device& w, void* out, DType dtype, cudaStream_t st) {
  const int64_t n = w.rows * (w.cols / 2);
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  NF4FLASH_DISPATCH_ACT(dtype, "q4_dequant", [&] {
    if (w.double_quant) q4_dequant_kernel<T, true><<<blocks, threads, 0, st>>>(w, static_cast<T*>(out));
    else q4_dequant_kernel<T, false><<<blocks, threads, 0, st>>>(w, static_cast<T*>(out));
    CUDA_CHECK_LAUNCH();
  });
}

namespace {
template <typename TW, typename TA>
void launch_dense(const GemvDenseArgs& g, cudaStream_t st) {
  DenseKernelArgs a{g.w, g.N, g.K, g.x, g.T, g.bias, g.out, g.out_dtype == DType::F32};
  const int64_t want = (g.N + 7) / 8;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(want, int64_t(num_sms()) * 64));
  constexpr bool vec16 = sizeof(TW) == 2 && sizeof(TA) == 2;
  const bool aligned = (g.K % 8 == 0) && (reinterpret_cast<uintptr_t>(g.w) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(g.x) % 16 == 0);
  if (vec16 && aligned) {
    if (g.T == 1) gemv_dense_vec_kernel<TW, TA, 1><<<grid, 256, 0, st>>>(a);
    else gemv_dense_vec_kernel<TW, TA, kGemvMaxRows><<<grid, 256, 0, st>>>(a);
  } else {
    gemv_dense_scalar_kernel<TW, TA><<<grid, 256, 0, st>>>(a);
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

}  // namespace nf4flash::cuda
