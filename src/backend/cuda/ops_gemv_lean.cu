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

// Blocks of this instantiation one multiprocessor holds (its shared-memory limit set on first use).
template <typename TA, bool DQ, bool FULL, int FLAGS, int W, int U, int D, int MINB, int NS>
int lean_per_sm() {
  constexpr int lut = q4_lut_bytes(2);
  static const int per_sm = [] {
    auto kern = gemv_q4_lean_kernel<TA, DQ, FULL, FLAGS, W, U, D, MINB, NS>;
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, lut + kLeanXMax));
    int v = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kern, W * 32, lut + kLeanXMax));
    return v;
  }();
  return per_sm;
}

// One launch of the lean kernel over c.nst stages (NS = 1: one GEMV, at most one block per unit;
// stream-K (kLeanSK) and chained stages: every block the GPU holds at once, as the neighbour slots
// and the stage counters need them all resident).
template <typename TA, bool DQ, bool FULL, int FLAGS, int W, int U, int D, int MINB, int NS>
void launch_lean_cfg(Q4LeanArgs<NS>& c, cudaStream_t st) {
  constexpr int lut = q4_lut_bytes(2);
  auto kern = gemv_q4_lean_kernel<TA, DQ, FULL, FLAGS, W, U, D, MINB, NS>;
  const int per_sm = lean_per_sm<TA, DQ, FULL, FLAGS, W, U, D, MINB, NS>();
  int xb = 0;
  for (int s = 0; s < c.nst; ++s) {
    c.st[s].x_stride = seq_x_stride(c.st[s].cols);
    xb = std::max(xb, c.st[s].T * c.st[s].x_stride);
  }
  const int smem = lut + xb;
  int64_t grid = int64_t(std::max(per_sm, 1)) * gemv_num_sms();
  if constexpr (FLAGS & kLeanSK) {
    NF4FLASH_CHECK(grid <= c.st[0].sk_cap, "gemv_q4 stream-K: ", grid, " blocks for ", c.st[0].sk_cap, " slots");
  } else if constexpr (NS == 1) {
    grid = std::min<int64_t>(c.st[0].units, grid);
  } else {
    NF4FLASH_CHECK(per_sm >= 1, "gemv_q4 chain: no block of the kernel fits on a multiprocessor");
  }
  launch_k(kern, dim3(unsigned(grid)), dim3(W * 32), size_t(smem), st, c);
  CUDA_CHECK_LAUNCH();
}

template <typename TA, bool DQ, bool FULL, int FLAGS, int W, int U, int D, int MINB>
void launch_lean_cfg(Q4SeqArgs& k, cudaStream_t st) {
  Q4LeanArgs<1> c;
  c.st[0] = k;
  launch_lean_cfg<TA, DQ, FULL, FLAGS, W, U, D, MINB, 1>(c, st);
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

// Stream-K for a launch of `units` units over G resident blocks: opt-in (NF4FLASH_GEMV_SK=1; the
// backend allocates the slots only then), where whole units round-robin would leave > 10% of the
// last round idle (q/k/v: 384 units on 264 blocks, gate/up 896). Measured slower end to end (H200,
// fourteenth session: decode @512 386.2 vs 400.3 tok/s; 14336x4096 14.10 vs 13.51 us; q/k/v
// 6144x4096 7.47 vs 7.56). It can run when every block's range is at least one unit (a unit is
// split between two blocks at most) and the slots hold the grid.
bool lean_sk_wanted(const Q4SeqArgs& k, int64_t G) {
  if (!k.sk_slots || G > k.sk_cap || k.units < G) return false;
  const int64_t rounds = (k.units + G - 1) / G;
  return double(k.units) < 0.9 * double(rounds * G);
}

// The default configuration (h8u4d3) at T = 1 runs its kLeanT1 form (two accumulators of four per
// tile), and with NF4FLASH_GEMV_SK=1 its stream-K form where that balances the rounds.
template <typename TA, bool DQ>
bool launch_lean(Q4SeqArgs& k, std::string_view c, cudaStream_t st) {
  return visit_lean(c, [&](auto cfg) {
    using C = decltype(cfg);
    if constexpr (C::flags == (kLeanXPred | kLeanHalf)) {
      if (k.T == 1) {
        constexpr int FSK = C::flags | kLeanT1 | kLeanSK;
        if (k.KT % (C::W * C::U) == 0 &&
            lean_sk_wanted(k, int64_t(lean_per_sm<TA, DQ, true, FSK, C::W, C::U, C::D, C::MINB, 1>()) * gemv_num_sms()))
          launch_lean_cfg<TA, DQ, true, FSK, C::W, C::U, C::D, C::MINB>(k, st);
        else
          launch_lean_full<TA, DQ, C::flags | kLeanT1, C::W, C::U, C::D, C::MINB>(k, st);
        return;
      }
    }
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

static_assert(kGemvChainMaxStages == kChainMaxStages);

bool gemv_q4_chain_cfg(std::string_view cfg) { return cfg == "h8u4d3"; }

bool gemv_q4_chain_enabled() {
  // opt-in, "1" (H200, thirteenth session: slower than one launch per stage, docs/performance.md)
  const char* env = std::getenv("NF4FLASH_GEMV_CHAIN");
  return env && std::string_view(env) == "1" && gemv_q4_seq_enabled() && gemv_q4_chain_cfg(gemv_q4_seq_cfg());
}

bool gemv_q4_lean_chain(Q4SeqArgs* st, int n, unsigned* counters, bool bf16, bool dq, cudaStream_t stream, bool launch) {
  if (n < 2 || n > kChainMaxStages || !gemv_q4_chain_enabled()) return false;
  for (int s = 0; s < n; ++s) {
    const Q4SeqArgs& k = st[s];
    if (!gemv_q4_lean_applies(k) || k.KT % 32 || k.T != st[0].T || k.log2_blocksize != st[0].log2_blocksize ||
        k.log2_nested != st[0].log2_nested)
      return false;
  }
  if (!launch) return true;
  Q4LeanArgs<kChainMaxStages> c;
  for (int s = 0; s < n; ++s) c.st[s] = st[s];
  c.nst = n;
  c.cnt = counters;
  constexpr int F = kLeanXPred | kLeanHalf;  // h8u4d3
  if (bf16) {
    if (dq) launch_lean_cfg<__nv_bfloat16, true, true, F, 8, 4, 3, 2, kChainMaxStages>(c, stream);
    else launch_lean_cfg<__nv_bfloat16, false, true, F, 8, 4, 3, 2, kChainMaxStages>(c, stream);
  } else {
    if (dq) launch_lean_cfg<__half, true, true, F, 8, 4, 3, 2, kChainMaxStages>(c, stream);
    else launch_lean_cfg<__half, false, true, F, 8, 4, 3, 2, kChainMaxStages>(c, stream);
  }
  return true;
}

void gemv_q4_lean_grouped(Q4SeqArgs& k, bool bf16, bool dq, cudaStream_t st) {
  constexpr int F = kLeanXPred | kLeanHalf | kLeanT1 | kLeanGrouped, W = 8, U = 4;  // h8u4d3 at T = 1
  NF4FLASH_CHECK(k.tile_group == W * U && k.T == 1 && k.KT % (W * U) == 0 && gemv_q4_lean_applies(k),
                 "gemv_q4: 4-bit tiles in groups of ", k.tile_group, " are read by the lean kernel at T = 1 with ",
                 W * U, "-tile groups alone (T=", k.T, ", ", k.KT, " column tiles)");
  if (bf16) {
    if (dq) launch_lean_cfg<__nv_bfloat16, true, true, F, W, U, 3, 2>(k, st);
    else launch_lean_cfg<__nv_bfloat16, false, true, F, W, U, 3, 2>(k, st);
  } else {
    if (dq) launch_lean_cfg<__half, true, true, F, W, U, 3, 2>(k, st);
    else launch_lean_cfg<__half, false, true, F, W, U, 3, 2>(k, st);
  }
}

void gemv_q4_lean_ablated(Q4SeqArgs& k, bool bf16, bool dq, cudaStream_t st) {
  constexpr int F = kLeanXPred | kLeanHalf | kLeanT1, W = 8, U = 4;  // h8u4d3 at T = 1
  NF4FLASH_CHECK(bf16 && dq && k.T == 1 && k.KT % (W * U) == 0 && gemv_q4_lean_applies(k),
                 "gemv_q4: the ablations (kernel-bench) exist for the bf16 double-quant GEMV at T = 1 with whole ",
                 W * U, "-tile batches (", bf16 ? "bf16" : "f16", dq ? " double quant" : " single quant", ", T=", k.T,
                 ", ", k.KT, " column tiles)");
  switch (k.ablate) {  // the three rows kernel-bench times (each an instantiation of its own)
    case 1: return launch_lean_cfg<__nv_bfloat16, true, true, F | kLeanAblLut, W, U, 3, 2>(k, st);
    case 2: return launch_lean_cfg<__nv_bfloat16, true, true, F | kLeanAblScale, W, U, 3, 2>(k, st);
    case 7: return launch_lean_cfg<__nv_bfloat16, true, true, F | kLeanAblMask, W, U, 3, 2>(k, st);
    default: fail("gemv_q4: ablation mask ", k.ablate, " is not built (1: no table, 2: no absmax, 7: no decode)");
  }
}

bool gemv_q4_lean(Q4SeqArgs& k, std::string_view cfg, bool bf16, bool dq, cudaStream_t st) {
  if (bf16) return dq ? launch_lean<__nv_bfloat16, true>(k, cfg, st) : launch_lean<__nv_bfloat16, false>(k, cfg, st);
  return dq ? launch_lean<__half, true>(k, cfg, st) : launch_lean<__half, false>(k, cfg, st);
}

}  // namespace nf4flash::cuda
