// Launcher of the skinny 4-bit GEMM (kernels/gemm_q4_skinny.cuh): the configuration by row count,
// the grid (the resident blocks of every multiprocessor, stream-K ranges) and the workspace it needs.
#include <algorithm>

#include "backend/cuda/kernels/gemm_q4_skinny.cuh"

namespace nf4flash::cuda {

namespace {

// Token tiles of the kernel serving T rows.
int skinny_nt(int T) { return T <= 16 ? 2 : T <= 32 ? 4 : 8; }

// Stages and blocks per multiprocessor: one block of 6 stages for every token-tile count. H100,
// llama3-8b NF4-dq bench --batch 32: 4713 tok/s against 4450 with two blocks of 3 stages at 2 and 4
// token tiles (128 registers).
template <int NT>
struct SkCfg {
  static constexpr int S = 6, MINB = 1;
};

template <typename TA, bool DQ, int NT, typename C>
constexpr auto skinny_kernel = gemm_q4_skinny_kernel<TA, DQ, NT, C::S, C::MINB>;

// Resident blocks per multiprocessor of the kernel for NT token tiles (its shared-memory opt-in set
// on first use).
template <typename TA, bool DQ, int NT, typename C>
int skinny_per_sm_cfg() {
  static const int v = [] {
    constexpr auto kernel = skinny_kernel<TA, DQ, NT, C>;
    constexpr int smem = skinny_smem_bytes(NT, C::S);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kSkinnyW * 32, smem));
    return std::max(n, 1);
  }();
  return v;
}
template <typename TA, bool DQ, int NT>
int skinny_per_sm() {
  return skinny_per_sm_cfg<TA, DQ, NT, SkCfg<NT>>();
}
int skinny_per_sm(DType act, bool dq, int nt) {
  auto pick = [&](auto ta) {
    using TA = decltype(ta);
    if (dq) return nt == 2 ? skinny_per_sm<TA, true, 2>() : nt == 4 ? skinny_per_sm<TA, true, 4>() : skinny_per_sm<TA, true, 8>();
    return nt == 2 ? skinny_per_sm<TA, false, 2>() : nt == 4 ? skinny_per_sm<TA, false, 4>() : skinny_per_sm<TA, false, 8>();
  };
  return act == DType::F16 ? pick(__half{}) : pick(__nv_bfloat16{});
}

int64_t skinny_units(const GemmQ4SkinnyArgs& g) {
  int64_t u = 0;
  for (int s = 0; s < g.nseg; ++s) u += (g.w[s]->RT + kSkinnyW * kSkinnyR - 1) / (kSkinnyW * kSkinnyR);
  return u;
}

int skinny_grid(const GemmQ4SkinnyArgs& g) {
  const int64_t steps = skinny_units(g) * g.w[0]->KT;
  const int per_sm = skinny_per_sm(g.act, g.w[0]->double_quant, skinny_nt(g.T));
  return int(std::max<int64_t>(1, std::min<int64_t>(steps / kSkinnyMinSteps, int64_t(per_sm) * device_sm_count())));
}

template <typename TA, bool DQ, int NT, typename C>
void launch_skinny_cfg(const GemmQ4SkinnyArgs& g, cudaStream_t st) {
  constexpr auto kernel = skinny_kernel<TA, DQ, NT, C>;
  const Q4Device& w0 = *g.w[0];
  Q4SkinnyArgs k{};
  int64_t units = 0;
  for (int s = 0; s < g.nseg; ++s) {
    const Q4Device& w = *g.w[s];
    q4_fill_seg(k.seg[s], w, g.bias[s], g.out[s]);
    units += (w.RT + kSkinnyW * kSkinnyR - 1) / (kSkinnyW * kSkinnyR);
    k.unit_end[s] = int(units);
  }
  for (int i = 0; i < 16; ++i) k.code[i] = w0.code[i];
  k.nested_code = w0.nested_code;
  k.x = g.x;
  k.cols = w0.cols;
  k.KT = int(w0.KT);
  k.units = int(units);
  k.nseg = g.nseg;
  k.T = g.T;
  k.out_f32 = g.out_dtype == DType::F32;
  k.log2_blocksize = w0.log2_blocksize;
  k.log2_nested = w0.log2_nested;
  const int grid = skinny_grid(g);
  const GemmQ4SkinnyWs need = gemm_q4_skinny_ws_needed(g);
  NF4FLASH_CHECK(g.ws.partial && g.ws.floats >= need.floats && g.ws.tickets && g.ws.n_tickets >= need.n_tickets,
                 "gemm_q4_skinny: workspace of ", g.ws.floats, " floats / ", g.ws.n_tickets, " counters, needs ",
                 need.floats, " / ", need.n_tickets);
  k.partial = g.ws.partial;
  k.tickets = g.ws.tickets;
  launch_k(kernel, dim3(unsigned(grid)), dim3(kSkinnyW * 32), size_t(skinny_smem_bytes(NT, C::S)), st, k);
  CUDA_CHECK_LAUNCH();
}

template <typename TA, bool DQ, int NT>
void launch_skinny(const GemmQ4SkinnyArgs& g, cudaStream_t st) {
  launch_skinny_cfg<TA, DQ, NT, SkCfg<NT>>(g, st);
}

template <typename TA, bool DQ>
void launch_skinny_nt(const GemmQ4SkinnyArgs& g, cudaStream_t st) {
  switch (skinny_nt(g.T)) {
    case 2: return launch_skinny<TA, DQ, 2>(g, st);
    case 4: return launch_skinny<TA, DQ, 4>(g, st);
    default: return launch_skinny<TA, DQ, 8>(g, st);
  }
}

}  // namespace

GemmQ4SkinnyWs gemm_q4_skinny_ws_needed(const GemmQ4SkinnyArgs& g) {
  const int64_t slice = int64_t(kSkinnyR) * skinny_nt(g.T) * 4 * kSkinnyW * 32;
  const int64_t units = skinny_units(g);
  GemmQ4SkinnyWs r;
  r.floats = (units + skinny_grid(g)) * slice;
  r.n_tickets = units;
  return r;
}

void gemm_q4_skinny(const GemmQ4SkinnyArgs& g, cudaStream_t st) {
  NF4FLASH_CHECK(g.T >= 1 && g.T <= kQ4SkinnyMaxRows, "gemm_q4_skinny: T=", g.T, " outside 1..", kQ4SkinnyMaxRows);
  NF4FLASH_CHECK(g.nseg >= 1 && g.nseg <= kSkinnyMaxSegs, "gemm_q4_skinny: ", g.nseg, " weights (1..", kSkinnyMaxSegs, ")");
  const Q4Device& w0 = *g.w[0];
  for (int s = 1; s < g.nseg; ++s)
    NF4FLASH_CHECK(q4_same_params(*g.w[s], w0),
                   "gemm_q4_skinny: weights of one launch need the same columns and quantization parameters");
  NF4FLASH_CHECK(int64_t(g.T) * w0.cols < (int64_t(1) << 31), "gemm_q4_skinny: x of ", g.T, " x ", w0.cols,
                 " elements (32-bit offsets)");
  NF4FLASH_CHECK(w0.cols % 64 == 0 && w0.KT * 64 == w0.cols, "gemm_q4_skinny: cols ", w0.cols, " not a multiple of 64");
  NF4FLASH_CHECK(g.out_dtype == g.act || g.out_dtype == DType::F32, "gemm_q4_skinny: output dtype ",
                 dtype_name(g.out_dtype), " (the compute dtype or f32)");
  const bool dq = w0.double_quant;
  if (g.act == DType::BF16) {
    if (dq) launch_skinny_nt<__nv_bfloat16, true>(g, st);
    else launch_skinny_nt<__nv_bfloat16, false>(g, st);
  } else if (g.act == DType::F16) {
    if (dq) launch_skinny_nt<__half, true>(g, st);
    else launch_skinny_nt<__half, false>(g, st);
  } else {
    fail("gemm_q4_skinny: compute dtype ", dtype_name(g.act), " not supported (bf16/f16)");
  }
}

}  // namespace nf4flash::cuda
