// Launcher of the skinny 4-bit GEMM's wgmma form (kernels/gemm_q4_skinny.cuh, WG = true): the same
// units, grid and workspace as the mma.sync form at 17..32 rows (skinny_kernel_args), 32 tokens a
// block, 6 stages. Compiled for sm_90a when the build targets 90 (CMakeLists.txt); built
// without it, gemm_q4_skinny_wgmma_supported() is false: NF4FLASH_Q4_SKINNY_KERNEL=auto keeps
// mma.sync and =wgmma is refused by name.
#include "backend/cuda/kernels/gemm_q4_skinny.cuh"

namespace nf4flash::cuda {

namespace {

constexpr int kWgStages = 6;
static_assert(skinny_smem_bytes(4, kWgStages, true) + 2048 <= 227 * 1024, "gemm_q4_skinny wgmma: shared memory");

}  // namespace

// The fused GEMM's requirement (this file is built for sm_90a exactly when it is).
bool gemm_q4_skinny_wgmma_supported() { return gemm_q4_wgmma_supported(); }

void gemm_q4_skinny_wgmma(const GemmQ4SkinnyArgs& g, cudaStream_t st) {
  NF4FLASH_CHECK(gemm_q4_skinny_wgmma_supported(),
                 "gemm_q4_skinny: the wgmma form needs a compute capability 9.0 GPU and a build for sm_90a");
  NF4FLASH_CHECK(gemm_q4_skinny_wgmma_rows(g.T), "gemm_q4_skinny: the wgmma form serves 17..", kSkinnyWgTokens,
                 " rows (T=", g.T, ")");
  skinny_dispatch(g, [&](auto ta, auto dq) { skinny_launch<decltype(ta), decltype(dq)::value, 4, kWgStages, true>(g, st); });
}

}  // namespace nf4flash::cuda
