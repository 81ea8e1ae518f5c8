// Launcher of the lean in-order decode GEMV (kernels/gemv_q4_lean.cuh): configurations
// <letter><W>u<U>d<D>[m1] named by NF4FLASH_GEMV_SEQ_CFG; the letter picks the variant (LeanFlags):
// l = cross-warp reduction behind block barriers (as gemv_q4_seq), a = the barrier-free last-warp
// reduction, p = l with x loaded only by the lanes of real tokens, h = p with one absmax load and
// decode per two tiles (the half-warps split the pair).
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "backend/cuda/kernels/gemv_q4_lean.cuh"

namespace nf4flash::cuda {

namespace {
constexpr int kLeanXMax = 38 * 1024;  // x staged beside the 64 KB table at 2 blocks per SM

template <typename TA, bool DQ, bool FULL, int FLAGS, int W, int U, int D, int MINB>
void launch_lean_cfg(Q4SeqArgs& k, cudaStream_t st) {
  constexpr int lut = q4_lut_bytes(2);
  auto kern = gemv_q4_lean_kernel<TA, DQ, FULL, FLAGS, W, U, D, MINB>;
  static const int per_sm = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, lut + kLeanXMax));
    int v = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kern, W * 32, lut + kLeanXMax));
    return std::max(v, 1);
  }();
  k.x_stride = seq_x_stride(k.cols);
  const int smem = lut + k.T * k.x_stride;
  const int grid = int(std::min<int64_t>(k.units, int64_t(per_sm) * gemv_num_sms()));
  launch_k(kern, dim3(unsigned(grid)), dim3(W * 32), size_t(smem), st, k);
  CUDA_CHECK_LAUNCH();
}

template <typename TA, bool DQ, int FLAGS, int W, int U, int D, int MINB>
void launch_lean_full(Q4SeqArgs& k, cudaStream_t st) {
  if (k.KT % (W * U) == 0) launch_lean_cfg<TA, DQ, true, FLAGS, W, U, D, MINB>(k, st);
  else launch_lean_cfg<TA, DQ, false, FLAGS, W, U, D, MINB>(k, st);
}

// The lean configurations, one table: f receives (flags, W, U, D, MINB) as a LeanCfg type; false
// for names that are not lean configurations. Measured slower and dropped (H200): a8u4d4 (352.8
// tok/s at ctx 512), a16u4d3m1 (318.0) in the eighth session; s8u4d3 (p8u4d3 with each tile's four
// mma in two chains: 385.9 against 388.2) in the ninth.
template <int F_, int W_, int U_, int D_, int M_>
struct LeanCfg {
  static constexpr int flags = F_;
  static constexpr int W = W_, U = U_, D = D_, MINB = M_;
};
template <typename F>
bool visit_lean(std::string_view c, F&& f) {
  if (c == "l8u4d3") f(LeanCfg<0, 8, 4, 3, 2>{});
  else if (c == "a8u4d3") f(LeanCfg<kLeanAsync, 8, 4, 3, 2>{});
  else if (c == "p8u4d3") f(LeanCfg<kLeanXPred, 8, 4, 3, 2>{});
  else if (c == "h8u4d3") f(LeanCfg<kLeanXPred | kLeanHalf, 8, 4, 3, 2>{});
  // x / y / z / v: p8u4d3 with 1 / 2 / 3 / 4 of each tile's 4 code words decoded from register tables
  else if (c == "x8u4d3") f(LeanCfg<kLeanXPred | kLeanAlu1, 8, 4, 3, 2>{});
  else if (c == "y8u4d3") f(LeanCfg<kLeanXPred | kLeanAlu2, 8, 4, 3, 2>{});
  else if (c == "z8u4d3") f(LeanCfg<kLeanXPred | kLeanAlu1 | kLeanAlu2, 8, 4, 3, 2>{});
  else if (c == "v8u4d3") f(LeanCfg<kLeanXPred | kLeanAlu4, 8, 4, 3, 2>{});
  else return false;
  return true;
}

template <typename TA, bool DQ>
bool launch_lean(Q4SeqArgs& k, std::string_view c, cudaStream_t st) {
  return visit_lean(c, [&](auto cfg) {
    using C = decltype(cfg);
    launch_lean_full<TA, DQ, C::flags, C::W, C::U, C::D, C::MINB>(k, st);
  });
}
}  // namespace

int gemv_q4_lean_warps(std::string_view cfg) {
  int w = 0;
  visit_lean(cfg, [&](auto c) { w = decltype(c)::W; });
  return w;
}

bool gemv_q4_norm_fusable(int64_t T, int64_t cols) {
  if (!gemv_q4_seq_enabled()) return false;
  const char* off = std::getenv("NF4FLASH_FUSE_NORM");  // "0": the unfused order (comparison)
  if (off && std::string_view(off) == "0") return false;
  // 256-thread lean configurations: the prologue repeats rms_norm_vec_kernel's summation order
  if (gemv_q4_lean_warps(gemv_q4_seq_cfg()) != 8) return false;
  return T >= 1 && T <= kGemvMaxRows && cols % 64 == 0 && cols / 8 <= 1024 && T * seq_x_stride(cols) <= kLeanXMax;
}

bool gemv_q4_lean_applies(const Q4SeqArgs& k) {
  if (int64_t(k.T) * seq_x_stride(k.cols) > kLeanXMax) return false;  // x must fit in shared memory
  if (k.units > (int64_t(1) << 30) || k.KT > (int64_t(1) << 24)) return false;
  for (int s = 0; s < k.nseg; ++s)  // 32-bit row * cols (nested absmax index)
    if (uint64_t(k.seg[s].rows) * uint64_t(k.cols) >= (uint64_t(1) << 32)) return false;
  return true;
}

bool gemv_q4_lean(Q4SeqArgs& k, std::string_view cfg, bool bf16, bool dq, cudaStream_t st) {
  if (bf16) return dq ? launch_lean<__nv_bfloat16, true>(k, cfg, st) : launch_lean<__nv_bfloat16, false>(k, cfg, st);
  return dq ? launch_lean<__half, true>(k, cfg, st) : launch_lean<__half, false>(k, cfg, st);
}

}  // namespace nf4flash::cuda
