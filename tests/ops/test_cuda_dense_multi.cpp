// The dense multi-weight decode GEMV (kernels/gemv_dense_multi.cuh) on fresh random inputs:
// linear_multi over 1-3 dense weights (q/k/v), linear over one, and linear_swiglu over dense
// gate/up must give bit for bit what separate launches of gemv_dense_vec_kernel (plus silu_mul)
// give on the GPU (NF4FLASH_DENSE_MULTI=0), and so must the single-weight stream kernel
// (NF4FLASH_DENSE_STREAM=4|8) and the vec kernel (=0), and stay close to the CPU backend. Odd row counts, K
// not a multiple of the per-lane step (32 lanes x 8 chunks x 8 values), 1..8 tokens, bias on some
// weights, bf16 and f16 weights. The decode step's fused forms over dense weights: the norm folded
// into the multi-weight GEMV (rms_norm_linear_multi / rms_norm_linear_swiglu) and the residual add
// in the single-weight kernels (linear_residual; opt-in NF4FLASH_DENSE_FUSE_NORM=1), bit for bit
// the unfused ops.
#include "core/error.h"
#include "ops/cuda_test_util.h"

#include <cstdlib>
#include <string>

namespace nf4flash::test {
namespace {

struct DW {
  std::unique_ptr<Weight> cpu, gpu, bcpu, bgpu;
  int64_t N = 0;
};

DW make_dense(Backends& b, DType dt, int64_t N, int64_t K, bool bias) {
  DW w;
  w.N = N;
  auto W = randn(size_t(N * K), 0.05f);
  w.gpu = b.gpu->upload_dense(f32_tensor(W, {N, K}), dt);
  // the CPU reference multiplies the same rounded weights
  const auto Wr = rounded(W, dt);
  w.cpu = b.cpu->upload_dense(f32_tensor(Wr, {N, K}), DType::F32);
  if (bias) {
    auto B = randn(size_t(N), 0.1f);
    w.bcpu = b.cpu->upload_dense(f32_tensor(B, {N}), DType::F32);
    w.bgpu = b.gpu->upload_dense(f32_tensor(B, {N}), dt);
  }
  return w;
}

void run_dense_multi(DType dt, int64_t K, const std::vector<int64_t>& N, int64_t T) {
  SCOPED_TRACE(cat("dense linear_multi K=", K, " T=", T, " segments=", N.size(), " ", dtype_name(dt)));
  Backends b(dt);
  std::vector<DW> ws;
  for (size_t i = 0; i < N.size(); ++i) ws.push_back(make_dense(b, dt, N[i], K, i != 1));
  auto X = rounded(randn(size_t(T * K)), dt);
  DevAct xc(*b.cpu, T, K), xg(*b.gpu, T, K);
  xc.set(X);
  xg.set(X);
  std::vector<std::unique_ptr<DevAct>> yc, yg, ys;
  std::vector<Backend::LinearOut> oc, og;
  for (auto& w : ws) {
    yc.push_back(std::make_unique<DevAct>(*b.cpu, T, w.N));
    yg.push_back(std::make_unique<DevAct>(*b.gpu, T, w.N));
    ys.push_back(std::make_unique<DevAct>(*b.gpu, T, w.N));
    yg.back()->poison();
    oc.push_back({w.cpu.get(), w.bcpu.get(), yc.back()->act});
    og.push_back({w.gpu.get(), w.bgpu.get(), yg.back()->act});
  }
  b.cpu->linear_multi(xc.act, oc.data(), int(oc.size()));
  b.gpu->linear_multi(xg.act, og.data(), int(og.size()));
  for (size_t i = 0; i < ws.size(); ++i) {
    const auto y = yg[i]->get();
    // its own launch: the same kernel, then the single-weight kernels (stream U=4, U=8, vec)
    for (const char* mode : {"2", "0/4", "0/8", "0/0"}) {
      const std::string m(mode);
      setenv("NF4FLASH_DENSE_MULTI", m.substr(0, 1).c_str(), 1);
      if (m.size() > 1) setenv("NF4FLASH_DENSE_STREAM", m.substr(2).c_str(), 1);
      ys[i]->poison();
      b.gpu->linear(xg.act, *ws[i].gpu, ws[i].bgpu.get(), ys[i]->act);
      EXPECT_EQ(y, ys[i]->get()) << "segment " << i << " differs from its own launch, NF4FLASH_DENSE_MULTI/STREAM=" << mode;
    }
    // the row-split kernel (one row per block) sums in another order: close to it
    setenv("NF4FLASH_DENSE_MULTI", "0", 1);
    setenv("NF4FLASH_DENSE_STREAM", "k", 1);
    ys[i]->poison();
    b.gpu->linear(xg.act, *ws[i].gpu, ws[i].bgpu.get(), ys[i]->act);
    EXPECT_LT(rel_err(ys[i]->get(), y), 5e-3) << "segment " << i << " row-split kernel";
    unsetenv("NF4FLASH_DENSE_MULTI");
    unsetenv("NF4FLASH_DENSE_STREAM");
    EXPECT_LT(rel_err(y, yc[i]->get()), 5e-3) << "segment " << i << " N=" << ws[i].N;
  }
}

void run_dense_swiglu(DType dt, int64_t I, int64_t H, int64_t T, bool bias) {
  SCOPED_TRACE(cat("dense linear_swiglu I=", I, " H=", H, " T=", T, " ", dtype_name(dt)));
  Backends b(dt);
  DW g = make_dense(b, dt, I, H, bias), u = make_dense(b, dt, I, H, bias);
  auto X = rounded(randn(size_t(T * H)), dt);
  DevAct xc(*b.cpu, T, H), xg(*b.gpu, T, H), tc(*b.cpu, T, I), tg(*b.gpu, T, I), oc(*b.cpu, T, I), og(*b.gpu, T, I),
      gs(*b.gpu, T, I), us(*b.gpu, T, I);
  xc.set(X);
  xg.set(X);
  og.poison();
  b.cpu->linear_swiglu(xc.act, *g.cpu, g.bcpu.get(), *u.cpu, u.bcpu.get(), tc.act, oc.act);
  b.gpu->linear_swiglu(xg.act, *g.gpu, g.bgpu.get(), *u.gpu, u.bgpu.get(), tg.act, og.act);
  // the unfused composition on the GPU: two launches of gemv_dense_vec_kernel and silu_mul
  setenv("NF4FLASH_DENSE_MULTI", "0", 1);
  b.gpu->linear(xg.act, *g.gpu, g.bgpu.get(), gs.act);
  b.gpu->linear(xg.act, *u.gpu, u.bgpu.get(), us.act);
  unsetenv("NF4FLASH_DENSE_MULTI");
  b.gpu->silu_mul(gs.act, us.act, us.act);
  const auto y = og.get();
  EXPECT_EQ(y, us.get()) << "fused gate+up+silu differs from linear, linear, silu_mul";
  EXPECT_LT(rel_err(y, oc.get()), 1e-2);
}

TEST(CudaDenseMulti, LinearMulti) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    run_dense_multi(dt, 4096, {1024, 256, 256}, 1);
    run_dense_multi(dt, 1000, {77, 5, 300}, 3);  // K: 125 chunks of 8, not a multiple of 32 x 8
    run_dense_multi(dt, 512, {33, 64}, 8);
    run_dense_multi(dt, 264, {9}, 2);
  }
}

// One weight with f32 output (the lm_head's logits): the new kernel and the vec kernel agree.
TEST(CudaDenseMulti, LinearF32Out) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    for (int64_t T : {1, 5}) {
      SCOPED_TRACE(cat("f32 out ", dtype_name(dt), " T=", T));
      Backends b(dt);
      DW w = make_dense(b, dt, 3001, 1024, true);
      auto X = rounded(randn(size_t(T * 1024)), dt);
      DevAct xg(*b.gpu, T, 1024), xc(*b.cpu, T, 1024), yc(*b.cpu, T, 3001, DType::F32);
      xg.set(X);
      xc.set(X);
      // multi kernel, then the stream kernel (U=4, 8) and the vec kernel (NF4FLASH_DENSE_STREAM)
      std::vector<float> ys[4];
      const char* multi[4] = {"2", "0", "0", "0"};
      const char* stream[4] = {"4", "4", "8", "0"};
      for (int m = 0; m < 4; ++m) {
        setenv("NF4FLASH_DENSE_MULTI", multi[m], 1);
        setenv("NF4FLASH_DENSE_STREAM", stream[m], 1);
        DevAct y(*b.gpu, T, 3001, DType::F32);
        y.poison();
        b.gpu->linear(xg.act, *w.gpu, w.bgpu.get(), y.act);
        ys[m] = y.get();
      }
      // the row-split kernel sums in another order: close, not bit-identical
      setenv("NF4FLASH_DENSE_MULTI", "0", 1);
      setenv("NF4FLASH_DENSE_STREAM", "k", 1);
      DevAct ysplit(*b.gpu, T, 3001, DType::F32);
      ysplit.poison();
      b.gpu->linear(xg.act, *w.gpu, w.bgpu.get(), ysplit.act);
      unsetenv("NF4FLASH_DENSE_MULTI");
      unsetenv("NF4FLASH_DENSE_STREAM");
      for (int m = 1; m < 4; ++m) EXPECT_EQ(ys[0], ys[m]) << "NF4FLASH_DENSE_MULTI=" << multi[m] << " STREAM=" << stream[m];
      EXPECT_LT(rel_err(ysplit.get(), ys[0]), 1e-5) << "row-split kernel";
      b.cpu->linear(xc.act, *w.cpu, w.bcpu.get(), yc.act);
      EXPECT_LT(rel_err(ys[0], yc.get()), 5e-3);
    }
  }
}

// Long rows (K >= 8192: down_proj) take the vec kernel by default (bit for bit
// NF4FLASH_DENSE_STREAM=0); the row-split kernel (=k) is close to it and to the CPU. K = 8200: 1025
// chunks, a partial round of the 256-thread block; 37 rows; 1 and 3 tokens.
TEST(CudaDenseMulti, LongRowsVecByDefault) {
  NF4FLASH_REQUIRE_CUDA();
  for (int64_t T : {1, 3}) {
    SCOPED_TRACE(cat("T=", T));
    Backends b(DType::BF16);
    const int64_t N = 37, K = 8200;
    DW w = make_dense(b, DType::BF16, N, K, true);
    auto X = rounded(randn(size_t(T * K)), DType::BF16);
    DevAct xg(*b.gpu, T, K), xc(*b.cpu, T, K), yc(*b.cpu, T, N);
    xg.set(X);
    xc.set(X);
    std::vector<float> ys[3];
    const char* modes[3] = {"", "0", "k"};
    for (int m = 0; m < 3; ++m) {
      setenv("NF4FLASH_DENSE_STREAM", modes[m], 1);
      DevAct y(*b.gpu, T, N);
      y.poison();
      b.gpu->linear(xg.act, *w.gpu, w.bgpu.get(), y.act);
      ys[m] = y.get();
    }
    unsetenv("NF4FLASH_DENSE_STREAM");
    EXPECT_EQ(ys[0], ys[1]) << "default vs vec kernel";
    EXPECT_LT(rel_err(ys[0], ys[2]), 5e-3) << "default vs row-split kernel";
    b.cpu->linear(xc.act, *w.cpu, w.bcpu.get(), yc.act);
    EXPECT_LT(rel_err(ys[0], yc.get()), 5e-3);
  }
}

TEST(CudaDenseMulti, LinearSwiGLU) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    run_dense_swiglu(dt, 1792, 4096, 1, false);
    run_dense_swiglu(dt, 1000, 520, 3, true);
    run_dense_swiglu(dt, 40, 128, 8, false);
  }
}

// rms_norm_linear_multi / rms_norm_linear_swiglu over dense weights: x staged in shared memory and
// normalized by the GEMV (when fuses_norm_linear says so), bit for bit rms_norm + linear_multi /
// linear_swiglu on the GPU and close to the CPU; where x does not fit (T = 8, K = 4096) the
// unfused ops run and give the same numbers.
void run_dense_norm(DType dt, int64_t K, const std::vector<int64_t>& N, int64_t I, int64_t T, bool fused) {
  SCOPED_TRACE(cat("dense norm+linear K=", K, " T=", T, " ", dtype_name(dt)));
  Backends b(dt);
  std::vector<DW> ws;
  for (size_t i = 0; i < N.size(); ++i) ws.push_back(make_dense(b, dt, N[i], K, i == 0));
  DW g = make_dense(b, dt, I, K, false), u = make_dense(b, dt, I, K, true);
  auto X = rounded(randn(size_t(T * K), 3.f), dt);
  const auto Wn = randn(size_t(K), 1.f);
  auto nc = b.cpu->upload_dense(f32_tensor(Wn, {K}), DType::F32);
  auto ng = b.gpu->upload_dense(f32_tensor(Wn, {K}), dt);
  DevAct xc(*b.cpu, T, K), xg(*b.gpu, T, K), xnc(*b.cpu, T, K), xng(*b.gpu, T, K);
  xc.set(X);
  xg.set(X);
  EXPECT_EQ(b.gpu->fuses_norm_linear(*ws[0].gpu, T), fused);
  expect_norm_folds(b, xc, xg, xnc, xng, *nc, *ng, 1e-5f, ws, g, u, T, I);
}

TEST(CudaDenseMulti, NormFolded) {
  NF4FLASH_REQUIRE_CUDA();
  run_dense_norm(DType::BF16, 1024, {64, 32}, 96, 1, false);  // opt-in: off by default
  setenv("NF4FLASH_DENSE_FUSE_NORM", "1", 1);
  for (DType dt : {DType::BF16, DType::F16}) {
    run_dense_norm(dt, 4096, {1024, 256, 256}, 1792, 1, true);
    run_dense_norm(dt, 1000, {77, 5, 300}, 520, 3, true);
    run_dense_norm(dt, 4096, {64}, 40, 8, false);  // x of 8 tokens does not fit: the unfused ops
  }
  setenv("NF4FLASH_FUSE_NORM", "0", 1);  // the comparison switch: the unfused order
  run_dense_norm(DType::BF16, 1024, {64, 32}, 96, 1, false);
  unsetenv("NF4FLASH_FUSE_NORM");
  unsetenv("NF4FLASH_DENSE_FUSE_NORM");
}

// linear_residual over a dense weight: the residual add in the GEMV's store, bit for bit linear +
// add on the GPU (vec kernel: K = 4096; row-split kernel: K = 8200), bias or not, 1 and 3 tokens.
TEST(CudaDenseMulti, LinearResidual) {
  NF4FLASH_REQUIRE_CUDA();
  setenv("NF4FLASH_DENSE_FUSE_NORM", "1", 1);  // opt-in
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t K : {4096, 8200})
      for (int64_t T : {1, 3}) {
        SCOPED_TRACE(cat("dense linear_residual K=", K, " T=", T, " ", dtype_name(dt)));
        Backends b(dt);
        const int64_t N = 1000;
        DW w = make_dense(b, dt, N, K, T == 1);
        const auto X = rounded(randn(size_t(T * K)), dt), R = rounded(randn(size_t(T * N), 2.f), dt);
        DevAct x(*b.gpu, T, K), r1(*b.gpu, T, N), r2(*b.gpu, T, N), tmp(*b.gpu, T, N);
        DevAct xc(*b.cpu, T, K), rc(*b.cpu, T, N), tc(*b.cpu, T, N);
        x.set(X), xc.set(X), r1.set(R), r2.set(R), rc.set(R);
        b.gpu->linear_residual(x.act, *w.gpu, w.bgpu.get(), tmp.act, r1.act);
        b.gpu->linear(x.act, *w.gpu, w.bgpu.get(), tmp.act);
        b.gpu->add(r2.act, tmp.act, r2.act);
        b.cpu->linear_residual(xc.act, *w.cpu, w.bcpu.get(), tc.act, rc.act);
        EXPECT_EQ(r1.get(), r2.get()) << "linear_residual vs linear + add";
        EXPECT_LT(rel_err(r1.get(), rc.get()), 5e-3);
      }
  unsetenv("NF4FLASH_DENSE_FUSE_NORM");
}

}  // namespace
}  // namespace nf4flash::test
