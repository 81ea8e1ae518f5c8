// CUDA linear products against the CPU f32 backend on fresh random inputs: dense weights (GEMV and
// cuBLAS) and 4-bit weights on every LinearPlan path (the decode GEMV at 1-8 rows, the register
// GEMV at 9-32, the fused wgmma GEMM and dequantize + cuBLAS above, whole and in row chunks),
// selected through CudaTuning; and the path names the backend reports.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>

#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "ops/cuda_test_util.h"
#include "quant/blockwise.h"

namespace nf4flash::test {
namespace {

struct LinCase {
  int64_t N, K, T;
  bool bias, out_f32;
};

void run_dense_linear(DType compute, const LinCase& c) {
  Backends b(compute);
  auto W = rounded(randn(size_t(c.N * c.K), 0.05f), compute);
  auto X = rounded(randn(size_t(c.T * c.K)), compute);
  auto B = randn(size_t(c.N), 0.1f);
  auto wc = b.cpu->upload_dense(f32_tensor(W, {c.N, c.K}), DType::F32);
  auto wg = b.gpu->upload_dense(f32_tensor(W, {c.N, c.K}), compute);
  auto bc = b.cpu->upload_dense(f32_tensor(B, {c.N}), DType::F32);
  auto bg = b.gpu->upload_dense(f32_tensor(B, {c.N}), compute);
  DevAct xc(*b.cpu, c.T, c.K), yc(*b.cpu, c.T, c.N);
  DevAct xg(*b.gpu, c.T, c.K), yg(*b.gpu, c.T, c.N, c.out_f32 ? DType::F32 : compute);
  xc.set(X);
  xg.set(X);
  yg.poison();
  b.cpu->linear(xc.act, *wc, c.bias ? bc.get() : nullptr, yc.act);
  b.gpu->linear(xg.act, *wg, c.bias ? bg.get() : nullptr, yg.act);
  const double e = rel_err(yg.get(), yc.get());
  EXPECT_LT(e, tol_for(c.out_f32 ? compute : compute) + (compute == DType::F32 ? 1e-4 : 0))
      << "dense N=" << c.N << " K=" << c.K << " T=" << c.T << " path " << b.gpu->linear_path(*wg, c.T);
}

TEST(CudaOps, LinearDense) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (LinCase c : {LinCase{123, 200, 1, true, false}, LinCase{1000, 512, 1, false, true},
                      LinCase{515, 256, 3, true, false}, LinCase{300, 1024, 8, false, true},
                      LinCase{257, 320, 17, true, false}, LinCase{64, 96, 40, false, true}})
      run_dense_linear(dt, c);
}

struct Q4Case {
  QuantType type;
  bool dq;
  int64_t N, K;
  int bs;
  int64_t T;
  bool out_f32 = true;
};

void run_q4_linear(DType compute, const Q4Case& c, const CudaTuning& t = {}) {
  Backends b(compute, t);
  auto W = randn(size_t(c.N * c.K), 0.05f);
  Quant4Options qo;
  qo.type = c.type;
  qo.blocksize = c.bs;
  qo.double_quant = c.dq;
  auto q = std::make_shared<Quant4Tensor>(quantize_4bit(W.data(), DType::F32, c.N, c.K, qo));
  auto X = rounded(randn(size_t(c.T * c.K)), compute);
  auto B = randn(size_t(c.N), 0.1f);
  auto wc = b.cpu->upload_quant4(q);
  auto wg = b.gpu->upload_quant4(q);
  auto bc = b.cpu->upload_dense(f32_tensor(B, {c.N}), DType::F32);
  auto bg = b.gpu->upload_dense(f32_tensor(B, {c.N}), compute);
  DevAct xc(*b.cpu, c.T, c.K), yc(*b.cpu, c.T, c.N);
  DevAct xg(*b.gpu, c.T, c.K), yg(*b.gpu, c.T, c.N, c.out_f32 || compute == DType::F32 ? DType::F32 : compute);
  xc.set(X);
  xg.set(X);
  yg.poison();
  b.cpu->linear(xc.act, *wc, bc.get(), yc.act);
  b.gpu->linear(xg.act, *wg, bg.get(), yg.act);
  const double e = rel_err(yg.get(), yc.get());
  EXPECT_LT(e, compute == DType::F32 ? 1e-4 : c.out_f32 ? 5e-3 : 8e-3)
      << quant_type_name(c.type) << (c.dq ? "-dq" : "") << " N=" << c.N << " K=" << c.K << " bs=" << c.bs
      << " T=" << c.T << (c.out_f32 ? " f32 out" : "") << " path " << b.gpu->linear_path(*wg, c.T);
}

TEST(CudaOps, LinearQuant4) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (Q4Case c : {Q4Case{QuantType::NF4, false, 100, 256, 64, 1}, Q4Case{QuantType::NF4, true, 333, 640, 64, 1},
                     Q4Case{QuantType::FP4, false, 257, 512, 128, 3}, Q4Case{QuantType::FP4, true, 96, 1024, 64, 8},
                     Q4Case{QuantType::NF4, true, 4100, 384, 256, 1}, Q4Case{QuantType::NF4, true, 200, 448, 64, 21},
                     Q4Case{QuantType::NF4, false, 77, 96, 64, 2}, Q4Case{QuantType::NF4, true, 50, 200, 32, 1},
                     // more rows than the GEMV threshold (32): dequantize + cuBLAS
                     Q4Case{QuantType::NF4, true, 300, 512, 64, 40}, Q4Case{QuantType::FP4, false, 129, 1024, 128, 100}})
      run_q4_linear(dt, c);
  run_q4_linear(DType::F32, Q4Case{QuantType::NF4, true, 130, 256, 64, 1});
  run_q4_linear(DType::F32, Q4Case{QuantType::FP4, false, 65, 320, 64, 12});
}

// The register GEMV alone (9..32 rows take it with NF4FLASH_GEMV_MAX_ROWS=32): its 8-row launches,
// ragged last launch.
TEST(CudaOps, LinearQuant4RegisterGemv) {
  NF4FLASH_REQUIRE_CUDA();
  const auto gemv32 = tuning_with([](CudaTuning& t) { t.gemv_max_rows = 32; });
  for (DType dt : {DType::BF16, DType::F16})
    for (Q4Case c : {Q4Case{QuantType::NF4, true, 333, 640, 64, 9}, Q4Case{QuantType::FP4, false, 257, 512, 128, 16},
                     Q4Case{QuantType::NF4, true, 4100, 384, 256, 31, false}, Q4Case{QuantType::NF4, true, 64, 4096, 64, 32}})
      run_q4_linear(dt, c, gemv32);
  // with the default GEMV limit of 8 rows, 9 rows take the GEMM path instead (CudaTuning::gemv_max_rows)
  run_q4_linear(DType::BF16, Q4Case{QuantType::NF4, true, 333, 640, 64, 9});
  // and with 0, even one row
  run_q4_linear(DType::BF16, Q4Case{QuantType::NF4, true, 333, 640, 64, 1}, tuning_with([](CudaTuning& t) { t.gemv_max_rows = 0; }));
}

// The GEMM path dequantizes in row chunks for products of >= 2048 rows (CudaTuning::dequant_chunk_mb;
// 1 MiB here, so 300 x 2048 bf16 weights make chunks of 256 + 44 rows, f32 compute 128 + 128 + 44):
// each chunk's output columns land where the whole-matrix product puts them. Fewer rows: whole.
TEST(CudaOps, LinearQuant4Chunked) {
  NF4FLASH_REQUIRE_CUDA();
  const CudaTuning t = tuning_with([](CudaTuning& c) {
    c.q4_gemm = Q4GemmMode::Dequant;
    c.dequant_chunk_mb = 1;
  });
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    run_q4_linear(dt, Q4Case{QuantType::NF4, true, 300, 2048, 64, 2048}, t);
    run_q4_linear(dt, Q4Case{QuantType::FP4, false, 272, 4096, 128, 2050}, t);
  }
  Backends b(DType::BF16, t);
  auto W = randn(64 * 128, 0.05f);
  auto q = std::make_shared<Quant4Tensor>(quantize_4bit(W.data(), DType::F32, 64, 128, QuantType::NF4, 64, true));
  auto w = b.gpu->upload_quant4(q);
  EXPECT_NE(b.gpu->linear_path(*w, 2048).find("chunks of 1 MiB"), std::string::npos) << b.gpu->linear_path(*w, 2048);
  EXPECT_NE(b.gpu->linear_path(*w, 2047).find("whole matrix"), std::string::npos) << b.gpu->linear_path(*w, 2047);
}

// The fused wgmma GEMM (Hopper): ragged rows (row tiles past the matrix), ragged tokens (token tiles
// past T; 32-token tiles at batched-decode rows), one to 224 column tiles, odd and even, blocksizes
// 64 / 128 / 256, NF4 / FP4, plain / double-quant absmax, bias, f32 and 16-bit output, launches
// that split their last partial wave along K; and the dequantize path (what every other GPU takes)
// on the same cases.
TEST(CudaOps, LinearQuant4FusedGemm) {
  NF4FLASH_REQUIRE_CUDA();
  const Q4Case cases[] = {
      {QuantType::NF4, true, 300, 512, 64, 40, false},   {QuantType::FP4, false, 129, 1024, 128, 100, true},
      {QuantType::NF4, false, 64, 64, 64, 33, false},     {QuantType::NF4, true, 200, 128, 256, 257, false},
      {QuantType::NF4, true, 1000, 4096, 64, 130, false}, {QuantType::FP4, true, 136, 192, 64, 600, true},
      {QuantType::NF4, true, 4100, 256, 64, 65, false},   {QuantType::NF4, true, 4096, 1024, 64, 300, false},
      {QuantType::FP4, false, 4000, 1024, 128, 290, false},
      {QuantType::NF4, true, 4096, 14336, 64, 256, false},  // a down-projection shape: a split tail
      // batched-decode rows (32-token tiles), an odd number of column tiles, a split tail
      {QuantType::NF4, true, 300, 512, 64, 20, false},    {QuantType::FP4, false, 129, 192, 128, 9, false},
      {QuantType::NF4, true, 4096, 14336, 64, 32, false},
  };
  const CudaTuning dequant = tuning_with([](CudaTuning& t) { t.q4_gemm = Q4GemmMode::Dequant; });
  for (Q4Case c : cases) run_q4_linear(DType::BF16, c, dequant);
  if (!cuda::gemm_q4_wgmma_supported())
    GTEST_SKIP() << "fused 4-bit GEMM: needs a compute capability 9.0 GPU and a build for sm_90a";
  const CudaTuning fused = tuning_with([](CudaTuning& t) { t.q4_gemm = Q4GemmMode::Fused; });
  for (DType dt : {DType::BF16, DType::F16})
    for (Q4Case c : cases) run_q4_linear(dt, c, fused);
  // f32 compute has no fused kernel: asking for it is an error
  EXPECT_THROW(Backends(DType::F32, fused), Error);
}

TEST(CudaOps, Quant4PathNames) {
  NF4FLASH_REQUIRE_CUDA();
  auto W = randn(64 * 128, 0.05f);
  auto q = std::make_shared<Quant4Tensor>(quantize_4bit(W.data(), DType::F32, 64, 128, QuantType::NF4, 64, true));
  auto path = [&](const CudaTuning& t, int64_t rows) {
    Backends b(DType::BF16, t);
    auto w = b.gpu->upload_quant4(q);
    return b.gpu->linear_path(*w, rows);
  };
  const CudaTuning dflt;
  EXPECT_NE(path(dflt, 1).find("gemv_q4_decode"), std::string::npos) << path(dflt, 1);
  EXPECT_NE(path(dflt, 8).find("gemv_q4_decode"), std::string::npos) << path(dflt, 8);
  // 9..32 rows: the register GEMV where NF4FLASH_GEMV_MAX_ROWS allows it (default 8: the GEMM)
  const CudaTuning gemv32 = tuning_with([](CudaTuning& t) { t.gemv_max_rows = 32; });
  EXPECT_NE(path(gemv32, 9).find("gemv_q4 nf4-dq x2 launches"), std::string::npos) << path(gemv32, 9);
  EXPECT_EQ(path(dflt, 9).find("gemv_q4"), std::string::npos) << path(dflt, 9);
  // default (auto): the fused GEMM up to 512 rows where it runs, dequantize + cuBLAS above
  const bool fused = cuda::gemm_q4_wgmma_supported();
  EXPECT_NE(path(dflt, 100).find(fused ? "gemm_q4 fused" : "cublas"), std::string::npos) << path(dflt, 100);
  EXPECT_NE(path(dflt, 5000).find("cublas"), std::string::npos) << path(dflt, 5000);
  const CudaTuning max64 = tuning_with([](CudaTuning& t) { t.q4_fused_max_rows = 64; });
  EXPECT_NE(path(max64, 100).find("cublas"), std::string::npos) << path(max64, 100);
  const CudaTuning dq = tuning_with([](CudaTuning& t) { t.q4_gemm = Q4GemmMode::Dequant; });
  EXPECT_NE(path(dq, 100).find("cublas"), std::string::npos) << path(dq, 100);
  const CudaTuning f = tuning_with([](CudaTuning& t) { t.q4_gemm = Q4GemmMode::Fused; });
  if (fused) {
    EXPECT_NE(path(f, 100).find("gemm_q4 fused"), std::string::npos) << path(f, 100);
    EXPECT_NE(path(f, 5000).find("gemm_q4 fused"), std::string::npos) << path(f, 5000);
  } else {  // asking for what cannot run is an error, not a fallback
    EXPECT_THROW(path(f, 100), Error);
  }
}

}  // namespace
}  // namespace nf4flash::test
