// Launcher of the skinny 4-bit GEMM (kernels/gemm_q4_skinny.cuh): the configuration by row count,
// the grid (the resident blocks of every multiprocessor, stream-K ranges) and the workspace it needs.
// The wgmma form is launched from sm90a/gemm_q4_skinny_wgmma.cu with the arguments built here.
#include <algorithm>

#include "backend/cuda/kernels/gemm_q4_skinny.cuh"

namespace nf4flash::cuda {

namespace {

// Token tiles of the kernel serving T rows.
int skinny_nt(int T) { return T <= 16 ? 2 : T <= 32 ? 4 : 8; }

// One block of 6 stages per multiprocessor for every token-tile count (H100, llama3-8b NF4-dq
// bench --batch 32: 4713 tok/s against 4450 with two blocks of 3 stages at 2 and 4 token tiles,
// 128 registers). Its shared memory (131.5-172 KiB) leaves no room for a second block.
constexpr int kSkinnyStages = 6;
static_assert(2 * skinny_smem_bytes(2, kSkinnyStages) > 228 * 1024, "gemm_q4_skinny: one block per SM");

int64_t skinny_units(const GemmQ4SkinnyArgs& g) {
  int64_t u = 0;
  for (int s = 0; s < g.nseg; ++s) u += (g.w[s]->RT + kSkinnyW * kSkinnyR - 1) / (kSkinnyW * kSkinnyR);
  return u;
}

// Blocks of a launch over `units`: one per multiprocessor, at least kSkinnyMinSteps steps each.
int skinny_grid(int64_t units, int64_t KT) {
  return int(std::max<int64_t>(1, std::min<int64_t>(units * KT / kSkinnyMinSteps, device_sm_count())));
}

int64_t skinny_slice(int T) { return int64_t(kSkinnyR) * skinny_nt(T) * 4 * kSkinnyW * 32; }

template <typename TA, bool DQ>
void launch_skinny_nt(const GemmQ4SkinnyArgs& g, cudaStream_t st) {
  switch (skinny_nt(g.T)) {
    case 2: return skinny_launch<TA, DQ, 2, kSkinnyStages, false>(g, st);
    case 4: return skinny_launch<TA, DQ, 4, kSkinnyStages, false>(g, st);
    default: return skinny_launch<TA, DQ, 8, kSkinnyStages, false>(g, st);
  }
}

}  // namespace

Q4SkinnyArgs skinny_kernel_args(const GemmQ4SkinnyArgs& g, int& grid) {
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
  grid = skinny_grid(units, w0.KT);
  const int64_t floats = (units + grid) * skinny_slice(g.T);
  NF4FLASH_CHECK(g.ws.partial && g.ws.floats >= floats && g.ws.tickets && g.ws.n_tickets >= units,
                 "gemm_q4_skinny: workspace of ", g.ws.floats, " floats / ", g.ws.n_tickets, " counters, needs ",
                 floats, " / ", units);
  k.partial = g.ws.partial;
  k.tickets = g.ws.tickets;
  return k;
}

// The wgmma form's rows: its 32-token tile (skinny_nt = 4); at 9..16 rows mma.sync's 2 token tiles are
// faster (H100, 14336x4096 at 16 rows: 23.6 against 27.0 us).
bool gemm_q4_skinny_wgmma_rows(int64_t T) { return T > 16 && T <= kSkinnyWgTokens; }

GemmQ4SkinnyWs gemm_q4_skinny_ws_needed(const GemmQ4SkinnyArgs& g) {
  const int64_t units = skinny_units(g);
  GemmQ4SkinnyWs r;
  r.floats = (units + skinny_grid(units, g.w[0]->KT)) * skinny_slice(g.T);
  r.n_tickets = units;
  return r;
}

int gemm_q4_skinny_max_rows(size_t smem_per_block) {
  constexpr size_t kStaticSmem = 2048;  // the kernel's static shared arrays (1104 bytes), rounded up
  for (int T = kQ4SkinnyMaxRows; T > 0; T -= 8)
    if (size_t(skinny_smem_bytes(skinny_nt(T), kSkinnyStages)) + kStaticSmem <= smem_per_block) return T;
  return 0;
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
  if (g.wgmma && gemm_q4_skinny_wgmma_rows(g.T)) return gemm_q4_skinny_wgmma(g, st);
  skinny_dispatch(g, [&](auto ta, auto dq) { launch_skinny_nt<decltype(ta), decltype(dq)::value>(g, st); });
}

}  // namespace nf4flash::cuda
