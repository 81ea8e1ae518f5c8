// The skinny 4-bit GEMM (9..64 rows: the batched decode step's linears) against the CPU f32 backend:
// linear (one weight, bias, f32 and 16-bit output), linear_multi (q/k/v in one launch) and
// linear_swiglu (gate and up in one launch + silu_mul), at 9..64 tokens (2, 4 and 8 token tiles,
// ragged), NF4/FP4, plain and double-quant absmax, ragged rows (row tiles past the weight), and
// launches where units are cut between blocks (stream-K slots summed by the last block) or not.
// Every launch runs twice and must give bit-identical results (the counters reset themselves);
// the path names say which rows take it. The wgmma form (NF4FLASH_Q4_SKINNY_KERNEL=wgmma, sm_90a:
// 17..32 rows; 9..16 keep mma.sync) runs the same cases up to 32 rows. They need a GPU whose shared
// memory per block holds the kernel at 64 rows (Hopper); elsewhere they skip, and the rows take the
// other paths.
#include <cuda_runtime.h>

#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "ops/cuda_test_util.h"
#include "quant/blockwise.h"

namespace nf4flash::test {
namespace {

// The rows the skinny GEMM serves on this GPU (its shared memory per block: 64 on Hopper).
int skinny_rows_here() {
  int dev = 0, smem = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  return cuda::gemm_q4_skinny_max_rows(size_t(smem));
}
#define NF4FLASH_REQUIRE_SKINNY64()                                                                      \
  do {                                                                                                \
    NF4FLASH_REQUIRE_CUDA();                                                                          \
    if (skinny_rows_here() < 64)                                                                      \
      GTEST_SKIP() << "the skinny GEMM at 64 rows needs 172 KiB of shared memory per block (this GPU: " \
                   << skinny_rows_here() << " rows)";                                                 \
  } while (0)

// The skinny GEMM's mma.sync form up to its largest row count (the default stops at 32)
CudaTuning skinny64() {
  return tuning_with([](CudaTuning& t) {
    t.q4_skinny_max_rows = 64;
    t.q4_skinny_kernel = SkinnyKernelChoice::Mma;
  });
}

struct SkCase {
  QuantType type;
  bool dq;
  std::vector<int64_t> N;  // one weight: linear; more: linear_multi
  int64_t K, T;
  bool bias, out_f32 = false;
};

// The skinny GEMM's wgmma form (17..32 rows)
CudaTuning skinny_wgmma() {
  return tuning_with([](CudaTuning& t) { t.q4_skinny_kernel = SkinnyKernelChoice::Wgmma; });
}

void run_skinny(DType dt, const SkCase& c, const CudaTuning& tuning = skinny64()) {
  Backends b(dt, tuning);
  const bool wg = tuning.q4_skinny_kernel == SkinnyKernelChoice::Wgmma;
  std::vector<QW> ws;
  for (size_t i = 0; i < c.N.size(); ++i) ws.push_back(make_q4(b, dt, c.type, c.dq, c.N[i], c.K, c.bias && i != 1));
  const std::string path = b.gpu->linear_path(*ws[0].gpu, c.T);
  ASSERT_NE(path.find("gemm_q4_skinny"), std::string::npos) << path;
  ASSERT_EQ(path.find("wgmma") != std::string::npos, wg && c.T > 16) << path;
  SCOPED_TRACE(cat(quant_type_name(c.type), c.dq ? "-dq" : "", " N0=", c.N[0], " K=", c.K, " T=", c.T,
                   c.out_f32 ? " f32 out" : "", " ", dtype_name(dt)));
  auto X = rounded(randn(size_t(c.T * c.K)), dt);
  DevAct xc(*b.cpu, c.T, c.K), xg(*b.gpu, c.T, c.K);
  xc.set(X);
  xg.set(X);
  if (c.N.size() == 1) {
    DevAct yc(*b.cpu, c.T, c.N[0]), yg(*b.gpu, c.T, c.N[0], c.out_f32 ? DType::F32 : dt);
    yg.poison();
    b.cpu->linear(xc.act, *ws[0].cpu, ws[0].bcpu.get(), yc.act);
    b.gpu->linear(xg.act, *ws[0].gpu, ws[0].bgpu.get(), yg.act);
    const auto once = yg.get();
    EXPECT_LT(rel_err(once, yc.get()), c.out_f32 ? 5e-3 : 8e-3);
    yg.poison();
    b.gpu->linear(xg.act, *ws[0].gpu, ws[0].bgpu.get(), yg.act);
    EXPECT_EQ(yg.get(), once) << "second launch differs";
    return;
  }
  std::vector<std::unique_ptr<DevAct>> yc, yg;
  auto oc = linear_outs(*b.cpu, ws, c.T, true, yc), og = linear_outs(*b.gpu, ws, c.T, false, yg);
  b.cpu->linear_multi(xc.act, oc.data(), int(oc.size()));
  b.gpu->linear_multi(xg.act, og.data(), int(og.size()));
  std::vector<std::vector<float>> first;
  for (size_t i = 0; i < ws.size(); ++i) {
    first.push_back(yg[i]->get());
    EXPECT_LT(rel_err(first.back(), yc[i]->get()), 5e-3) << "segment " << i;
  }
  b.gpu->linear_multi(xg.act, og.data(), int(og.size()));
  for (size_t i = 0; i < ws.size(); ++i) EXPECT_EQ(yg[i]->get(), first[i]) << "second launch differs, segment " << i;
}

const std::vector<SkCase>& skinny_cases() {
  static const std::vector<SkCase> cases = {
      // units cut between blocks (16 units x 64 column tiles over every SM) and whole units
      {QuantType::NF4, true, {4096}, 4096, 32, false},
      {QuantType::NF4, true, {4096}, 14336, 64, true},
      {QuantType::NF4, true, {14336}, 4096, 9, false},
      {QuantType::NF4, true, {333}, 640, 17, true, true},   // ragged rows, one unit and a half
      {QuantType::FP4, false, {1000}, 1024, 16, true},
      {QuantType::NF4, false, {77}, 64, 40, true, true},    // one column tile, fewer steps than SMs
      {QuantType::FP4, true, {2050}, 192, 33, false},
      {QuantType::NF4, true, {4096, 1024, 1024}, 4096, 32, true},  // q/k/v
      {QuantType::FP4, false, {2050, 512, 512}, 3072, 24, true},
      {QuantType::NF4, true, {100, 37, 37}, 512, 64, false},
  };
  return cases;
}

TEST(CudaSkinny, LinearAndMulti) {
  NF4FLASH_REQUIRE_SKINNY64();
  for (DType dt : {DType::BF16, DType::F16})
    for (const SkCase& c : skinny_cases()) run_skinny(dt, c);
}

#define NF4FLASH_REQUIRE_SKINNY_WGMMA()                                                                    \
  do {                                                                                                    \
    NF4FLASH_REQUIRE_CUDA();                                                                              \
    if (!cuda::gemm_q4_skinny_wgmma_supported())                                                          \
      GTEST_SKIP() << "the skinny GEMM's wgmma form needs a compute capability 9.0 GPU and a build for sm_90a"; \
  } while (0)

TEST(CudaSkinny, WgmmaLinearAndMulti) {
  NF4FLASH_REQUIRE_SKINNY_WGMMA();
  for (DType dt : {DType::BF16, DType::F16})
    for (const SkCase& c : skinny_cases())
      if (c.T <= 32) run_skinny(dt, c, skinny_wgmma());
}

void run_swiglu(const CudaTuning& tuning, std::initializer_list<std::tuple<int64_t, int64_t, int64_t, bool>> shapes) {
  for (auto [I, H, T, bias] : shapes) {
    Backends b(DType::BF16, tuning);
    QW g = make_q4(b, DType::BF16, QuantType::NF4, true, I, H, bias), u = make_q4(b, DType::BF16, QuantType::NF4, true, I, H, bias);
    auto X = rounded(randn(size_t(T * H)), DType::BF16);
    DevAct xc(*b.cpu, T, H), xg(*b.gpu, T, H), tc(*b.cpu, T, I), tg(*b.gpu, T, I), oc(*b.cpu, T, I), og(*b.gpu, T, I);
    xc.set(X);
    xg.set(X);
    og.poison();
    b.cpu->linear_swiglu(xc.act, *g.cpu, g.bcpu.get(), *u.cpu, u.bcpu.get(), tc.act, oc.act);
    b.gpu->linear_swiglu(xg.act, *g.gpu, g.bgpu.get(), *u.gpu, u.bgpu.get(), tg.act, og.act);
    const auto once = og.get();
    EXPECT_LT(rel_err(once, oc.get()), 1e-2) << "I=" << I << " H=" << H << " T=" << T;
    b.gpu->linear_swiglu(xg.act, *g.gpu, g.bgpu.get(), *u.gpu, u.bgpu.get(), tg.act, og.act);
    EXPECT_EQ(og.get(), once) << "second launch differs";
  }
}

TEST(CudaSkinny, SwiGLU) {
  NF4FLASH_REQUIRE_SKINNY64();
  run_swiglu(skinny64(), {{14336, 4096, 64, false}, {1000, 512, 40, true}, {200, 128, 12, false}});
}

TEST(CudaSkinny, WgmmaSwiGLU) {
  NF4FLASH_REQUIRE_SKINNY_WGMMA();
  run_swiglu(skinny_wgmma(), {{14336, 4096, 32, false}, {1000, 512, 20, true}, {200, 128, 12, false}});
}

TEST(CudaSkinny, PathByRows) {
  NF4FLASH_REQUIRE_SKINNY64();
  auto q = random_quant4(64, 128, QuantType::NF4, true);
  auto path = [&](const CudaTuning& t, int64_t rows) {
    Backends b(DType::BF16, t);
    auto w = b.gpu->upload_quant4(q);
    return b.gpu->linear_path(*w, rows);
  };
  const CudaTuning dflt;
  EXPECT_NE(path(dflt, 8).find("gemv_q4_decode"), std::string::npos) << path(dflt, 8);
  for (int64_t rows : {9, 32}) EXPECT_NE(path(dflt, rows).find("gemm_q4_skinny"), std::string::npos) << path(dflt, rows);
  EXPECT_EQ(path(dflt, 33).find("gemm_q4_skinny"), std::string::npos) << path(dflt, 33);
  const CudaTuning to64 = tuning_with([](CudaTuning& t) { t.q4_skinny_max_rows = 64; });
  EXPECT_NE(path(to64, 64).find("gemm_q4_skinny"), std::string::npos) << path(to64, 64);
  EXPECT_EQ(path(to64, 65).find("gemm_q4_skinny"), std::string::npos) << path(to64, 65);
  const CudaTuning off = tuning_with([](CudaTuning& t) { t.q4_skinny_max_rows = 0; });
  EXPECT_EQ(path(off, 32).find("gemm_q4_skinny"), std::string::npos) << path(off, 32);
  // the default form: wgmma at 17..32 rows where it runs, mma.sync at 9..16
  EXPECT_EQ(path(dflt, 32).find("wgmma") != std::string::npos, cuda::gemm_q4_skinny_wgmma_supported()) << path(dflt, 32);
  EXPECT_NE(path(dflt, 16).find("mma.sync"), std::string::npos) << path(dflt, 16);
  const CudaTuning dq = tuning_with([](CudaTuning& t) { t.q4_gemm = Q4GemmMode::Dequant; });
  EXPECT_NE(path(dq, 32).find("cublas"), std::string::npos) << path(dq, 32);
  // f32 compute has no 4-bit tensor-core path
  Backends f32(DType::F32);
  auto w = f32.gpu->upload_quant4(q);
  EXPECT_EQ(f32.gpu->linear_path(*w, 32).find("gemm_q4_skinny"), std::string::npos);
}

// Which GPUs run it, from their opt-in shared memory per block (no GPU needed): none of the rows
// on 99 KiB (RTX 30/40 series), up to 32 on the A100 (163 KiB), all 64 on Hopper (227 KiB).
TEST(CudaSkinny, RowsBySharedMemory) {
  EXPECT_EQ(cuda::gemm_q4_skinny_max_rows(101376), 0);
  EXPECT_EQ(cuda::gemm_q4_skinny_max_rows(166912), 32);
  EXPECT_EQ(cuda::gemm_q4_skinny_max_rows(232448), 64);
}

}  // namespace
}  // namespace nf4flash::test
