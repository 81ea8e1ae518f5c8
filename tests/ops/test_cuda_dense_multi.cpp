// The dense decode GEMVs on fresh random inputs: linear_multi over 1-3 dense weights (q/k/v, the
// multi-weight kernel of kernels/gemv_dense_multi.cuh) and linear_swiglu over dense gate/up must
// give bit for bit what separate launches of gemv_dense_vec_kernel (plus silu_mul) give on the GPU
// (CudaTuning::dense_multi off), and stay close to the CPU backend. Odd row counts, K not a
// multiple of the per-lane step (32 lanes x 8 chunks x 8 values), long rows, 1..8 tokens, bias on
// some weights, bf16 and f16 weights, f32 output (the lm_head's logits). The decode step's other
// forms over dense weights (norm, residual) compose the plain ops: bit for bit rms_norm + linear.
#include "core/error.h"
#include "ops/cuda_test_util.h"

#include <string>
#include <tuple>

namespace nf4flash::test {
namespace {

struct DW {
  std::unique_ptr<Weight> cpu, gpu, bcpu, bgpu;
  int64_t N = 0;
  std::vector<float> ref, bias;  // the host values (for uploads to other backends)
};

DW make_dense(Backends& b, DType dt, int64_t N, int64_t K, bool bias) {
  DW w;
  w.N = N;
  w.ref = randn(size_t(N * K), 0.05f);
  w.gpu = b.gpu->upload_dense(f32_tensor(w.ref, {N, K}), dt);
  // the CPU reference multiplies the same rounded weights
  const auto Wr = rounded(w.ref, dt);
  w.cpu = b.cpu->upload_dense(f32_tensor(Wr, {N, K}), DType::F32);
  if (bias) {
    w.bias = randn(size_t(N), 0.1f);
    w.bcpu = b.cpu->upload_dense(f32_tensor(w.bias, {N}), DType::F32);
    w.bgpu = b.gpu->upload_dense(f32_tensor(w.bias, {N}), dt);
  }
  return w;
}

const CudaTuning kOneLaunchPerWeight = tuning_with([](CudaTuning& t) { t.dense_multi = false; });

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
  // one launch per weight (the vec kernel) on a backend without the multi-weight kernel
  Backends one(dt, kOneLaunchPerWeight);
  for (size_t i = 0; i < ws.size(); ++i) {
    const auto y = yg[i]->get();
    auto w1 = one.gpu->upload_dense(f32_tensor(rounded(ws[i].ref, dt), {ws[i].N, K}), dt);
    std::unique_ptr<Weight> b1;
    if (ws[i].bgpu) b1 = one.gpu->upload_dense(f32_tensor(ws[i].bias, {ws[i].N}), dt);
    DevAct x1(*one.gpu, T, K), y1(*one.gpu, T, ws[i].N);
    x1.set(X);
    y1.poison();
    one.gpu->linear(x1.act, *w1, b1.get(), y1.act);
    EXPECT_EQ(y, y1.get()) << "segment " << i << " differs from its own launch";
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
  b.gpu->linear(xg.act, *g.gpu, g.bgpu.get(), gs.act);
  b.gpu->linear(xg.act, *u.gpu, u.bgpu.get(), us.act);
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

// One weight with f32 output (the lm_head's logits) and long rows (K >= 8192: down_proj; K = 8200:
// 1025 chunks, a partial round of the 256-thread block): the vec kernel against the CPU, twice
// bit for bit.
TEST(CudaDenseMulti, LinearSingle) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (auto [N, K, f32] : {std::tuple{int64_t{3001}, int64_t{1024}, true}, std::tuple{int64_t{37}, int64_t{8200}, false}})
      for (int64_t T : {1, 3, 5}) {
        SCOPED_TRACE(cat(dtype_name(dt), " N=", N, " K=", K, f32 ? " f32 out" : "", " T=", T));
        Backends b(dt);
        DW w = make_dense(b, dt, N, K, true);
        auto X = rounded(randn(size_t(T * K)), dt);
        DevAct xg(*b.gpu, T, K), xc(*b.cpu, T, K), yc(*b.cpu, T, N), y(*b.gpu, T, N, f32 ? DType::F32 : dt);
        xg.set(X);
        xc.set(X);
        y.poison();
        b.gpu->linear(xg.act, *w.gpu, w.bgpu.get(), y.act);
        const auto once = y.get();
        b.gpu->linear(xg.act, *w.gpu, w.bgpu.get(), y.act);
        EXPECT_EQ(y.get(), once) << "second launch differs";
        b.cpu->linear(xc.act, *w.cpu, w.bcpu.get(), yc.act);
        EXPECT_LT(rel_err(once, yc.get()), 5e-3);
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

// rms_norm_linear_multi / rms_norm_linear_swiglu over dense weights: the backend does not fold the
// norm (fuses_norm_linear is false), the results are rms_norm + linear_multi / linear_swiglu's.
TEST(CudaDenseMulti, NormNotFolded) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    const int64_t K = 1024, T = 2, I = 96;
    Backends b(dt);
    std::vector<DW> ws;
    for (int64_t n : {64, 32}) ws.push_back(make_dense(b, dt, n, K, n == 64));
    DW g = make_dense(b, dt, I, K, false), u = make_dense(b, dt, I, K, true);
    const auto Wn = randn(size_t(K), 1.f);
    auto nc = b.cpu->upload_dense(f32_tensor(Wn, {K}), DType::F32);
    auto ng = b.gpu->upload_dense(f32_tensor(Wn, {K}), dt);
    DevAct xc(*b.cpu, T, K), xg(*b.gpu, T, K), xnc(*b.cpu, T, K), xng(*b.gpu, T, K);
    const auto X = rounded(randn(size_t(T * K), 3.f), dt);
    xc.set(X);
    xg.set(X);
    EXPECT_FALSE(b.gpu->fuses_norm_linear(*ws[0].gpu, T));
    expect_norm_folds(b, xc, xg, xnc, xng, *nc, *ng, 1e-5f, ws, g, u, T, I);
  }
}

}  // namespace
}  // namespace nf4flash::test
