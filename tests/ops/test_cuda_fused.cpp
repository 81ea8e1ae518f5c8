// The fused ops of the CUDA backend against the CPU backend's unfused composition, on fresh random
// inputs: the decode GEMV's q/k/v in one launch (linear_multi), residual add (linear_residual),
// gate+up+SiLU (linear_swiglu) and folded rms_norm (rms_norm_linear_*), x staged in shared memory
// or read from global memory; the fused GEMM's multi-weight launches and split tail (prompt rows);
// rope + KV write (rope_kv_write). Shapes cover large K, launches with fewer tiles than blocks,
// column tiles that are no whole number of batches, odd row counts, 1..8 tokens, NF4/FP4, plain and
// double-quant absmax, bias, bf16 and f16; every launch is run twice and must give bit-identical
// results.
#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "ops/cuda_test_util.h"
#include "quant/blockwise.h"

#include <cstdlib>
#include <tuple>

namespace nf4flash::test {
namespace {

struct MultiCase {
  QuantType type;
  bool dq;
  int64_t K;
  std::vector<int64_t> N;
  int64_t T;
};

void run_multi(DType dt, const MultiCase& c, const CudaTuning& t = {}) {
  Backends b(dt, t);
  std::vector<QW> ws;
  for (size_t i = 0; i < c.N.size(); ++i) ws.push_back(make_q4(b, dt, c.type, c.dq, c.N[i], c.K, i != 1));
  auto X = rounded(randn(size_t(c.T * c.K)), dt);
  DevAct xc(*b.cpu, c.T, c.K), xg(*b.gpu, c.T, c.K);
  xc.set(X);
  xg.set(X);
  std::vector<std::unique_ptr<DevAct>> yc, yg;
  std::vector<Backend::LinearOut> oc, og;
  for (auto& w : ws) {
    yc.push_back(std::make_unique<DevAct>(*b.cpu, c.T, w.N));
    yg.push_back(std::make_unique<DevAct>(*b.gpu, c.T, w.N));
    yg.back()->poison();
    oc.push_back({w.cpu.get(), w.bcpu.get(), yc.back()->act});
    og.push_back({w.gpu.get(), w.bgpu.get(), yg.back()->act});
  }
  b.cpu->linear_multi(xc.act, oc.data(), int(oc.size()));
  b.gpu->linear_multi(xg.act, og.data(), int(og.size()));
  std::vector<std::vector<float>> first;
  for (size_t i = 0; i < ws.size(); ++i) {
    first.push_back(yg[i]->get());
    EXPECT_LT(rel_err(first.back(), yc[i]->get()), 5e-3)
        << "linear_multi seg " << i << " N=" << ws[i].N << " K=" << c.K << " T=" << c.T << (c.dq ? " dq" : "")
        << " path " << b.gpu->linear_path(*ws[i].gpu, c.T);
  }
  b.gpu->linear_multi(xg.act, og.data(), int(og.size()));
  for (size_t i = 0; i < ws.size(); ++i) EXPECT_EQ(yg[i]->get(), first[i]) << "second launch differs, seg " << i;
}

TEST(CudaFused, LinearMulti) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (const MultiCase& c :
         {MultiCase{QuantType::NF4, true, 4096, {1024, 256, 256}, 1}, MultiCase{QuantType::NF4, false, 512, {100, 37, 37}, 3},
          MultiCase{QuantType::FP4, true, 64, {16}, 1}, MultiCase{QuantType::NF4, true, 1536, {333, 70}, 8},
          MultiCase{QuantType::NF4, true, 14336, {4096}, 2}, MultiCase{QuantType::FP4, false, 3072, {2050, 512, 512}, 5}})
      run_multi(dt, c);
}

void run_residual(DType dt, QuantType type, bool dq, int64_t N, int64_t K, int64_t T, bool bias) {
  Backends b(dt);
  QW w = make_q4(b, dt, type, dq, N, K, bias);
  auto X = rounded(randn(size_t(T * K)), dt), R = rounded(randn(size_t(T * N)), dt);
  DevAct xc(*b.cpu, T, K), xg(*b.gpu, T, K), rc(*b.cpu, T, N), rg(*b.gpu, T, N), tc(*b.cpu, T, N), tg(*b.gpu, T, N);
  xc.set(X); xg.set(X); rc.set(R); rg.set(R);
  b.cpu->linear_residual(xc.act, *w.cpu, w.bcpu.get(), tc.act, rc.act);
  b.gpu->linear_residual(xg.act, *w.gpu, w.bgpu.get(), tg.act, rg.act);
  EXPECT_LT(rel_err(rg.get(), rc.get()), 5e-3) << "linear_residual N=" << N << " K=" << K << " T=" << T;
  // again from the same residual: bit-identical
  const auto once = rg.get();
  rg.set(R);
  b.gpu->linear_residual(xg.act, *w.gpu, w.bgpu.get(), tg.act, rg.act);
  EXPECT_EQ(rg.get(), once) << "second launch differs";
}

TEST(CudaFused, LinearResidual) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    run_residual(dt, QuantType::NF4, true, 4096, 14336, 1, false);
    run_residual(dt, QuantType::NF4, true, 4096, 14336, 4, true);  // x in global memory
    run_residual(dt, QuantType::NF4, true, 4096, 4096, 4, true);
    run_residual(dt, QuantType::FP4, false, 77, 192, 8, true);
    run_residual(dt, QuantType::NF4, false, 16, 64, 1, false);
  }
}

void run_swiglu(DType dt, QuantType type, bool dq, int64_t I, int64_t H, int64_t T, bool bias,
                const CudaTuning& t = {}) {
  Backends b(dt, t);
  QW g = make_q4(b, dt, type, dq, I, H, bias), u = make_q4(b, dt, type, dq, I, H, bias);
  auto X = rounded(randn(size_t(T * H)), dt);
  DevAct xc(*b.cpu, T, H), xg(*b.gpu, T, H), tc(*b.cpu, T, I), tg(*b.gpu, T, I), oc(*b.cpu, T, I), og(*b.gpu, T, I);
  xc.set(X); xg.set(X);
  og.poison();
  b.cpu->linear_swiglu(xc.act, *g.cpu, g.bcpu.get(), *u.cpu, u.bcpu.get(), tc.act, oc.act);
  b.gpu->linear_swiglu(xg.act, *g.gpu, g.bgpu.get(), *u.gpu, u.bgpu.get(), tg.act, og.act);
  const auto once = og.get();
  EXPECT_LT(rel_err(once, oc.get()), 1e-2) << "linear_swiglu I=" << I << " H=" << H << " T=" << T;
  b.gpu->linear_swiglu(xg.act, *g.gpu, g.bgpu.get(), *u.gpu, u.bgpu.get(), tg.act, og.act);
  EXPECT_EQ(og.get(), once) << "second launch differs";
}

TEST(CudaFused, LinearSwiGLU) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    run_swiglu(dt, QuantType::NF4, true, 14336, 4096, 1, false);
    run_swiglu(dt, QuantType::NF4, true, 1000, 512, 3, true);
    run_swiglu(dt, QuantType::FP4, false, 40, 128, 8, false);
  }
}

// The norm folded into the decode GEMV (rms_norm_linear_multi / rms_norm_linear_swiglu, the kernel's
// prologue): bit for bit what rms_norm + linear_multi / linear_swiglu give on the GPU (the prologue
// repeats rms_norm's summation order), close to the CPU; where x does not fit in shared memory, or
// with CudaTuning::fuse_norm off, the same numbers through the unfused ops.
void run_norm_linear(DType dt, int64_t K, const std::vector<int64_t>& N, int64_t T, int64_t I, bool fuse) {
  Backends b(dt, tuning_with([&](CudaTuning& t) { t.fuse_norm = fuse; }));
  std::vector<QW> ws;
  for (size_t i = 0; i < N.size(); ++i) ws.push_back(make_q4(b, dt, QuantType::NF4, true, N[i], K, i == 1));
  QW g = make_q4(b, dt, QuantType::NF4, true, I, K, false), u = make_q4(b, dt, QuantType::NF4, true, I, K, true);
  auto X = rounded(randn(size_t(T * K), 3.f), dt);
  auto Wn = randn(size_t(K), 1.f);
  auto nc = b.cpu->upload_dense(f32_tensor(Wn, {K}), DType::F32);
  auto ng = b.gpu->upload_dense(f32_tensor(Wn, {K}), dt);
  DevAct xc(*b.cpu, T, K), xg(*b.gpu, T, K), xnc(*b.cpu, T, K), xng(*b.gpu, T, K);
  xc.set(X);
  xg.set(X);
  EXPECT_EQ(b.gpu->fuses_norm_linear(*ws[0].gpu, T), fuse && T * (2 * K + 16) <= 38 * 1024) << "K=" << K << " T=" << T;
  SCOPED_TRACE(cat("K=", K, " T=", T, fuse ? "" : " fuse_norm off"));
  expect_norm_folds(b, xc, xg, xnc, xng, *nc, *ng, 1e-5f, ws, g, u, T, I);
}

TEST(CudaFused, NormLinear) {
  NF4FLASH_REQUIRE_CUDA();
  for (bool fuse : {true, false})
    for (DType dt : {DType::BF16, DType::F16}) {
      run_norm_linear(dt, 4096, {1024, 256, 256}, 1, 2048, fuse);
      run_norm_linear(dt, 1024, {320, 64, 64}, 3, 1000, fuse);
      run_norm_linear(dt, 4096, {512}, 5, 64, fuse);  // x of 5 tokens does not fit: the unfused ops
    }
}

// The decode GEMV on the fused forms: units crossing items and blocks, batches that run past the
// last column tile (K = 3072, 192, 512: column tiles not a multiple of the batch), several units
// per block, T = 1..8, and x too large for shared memory (T = 8, K = 14336: read from global).
TEST(CudaFused, DecodeGemvShapes) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16}) {
    for (const MultiCase& c : {MultiCase{QuantType::NF4, true, 4096, {1024, 256, 256}, 1},
                               MultiCase{QuantType::FP4, false, 3072, {2050, 512, 512}, 5},
                               MultiCase{QuantType::NF4, true, 192, {40000}, 2},
                               MultiCase{QuantType::NF4, true, 14336, {200}, 8},
                               MultiCase{QuantType::NF4, false, 14336, {300, 64}, 3}})
      run_multi(dt, c);
    run_residual(dt, QuantType::NF4, true, 4096, 14336, 1, true);
    run_swiglu(dt, QuantType::NF4, true, 1000, 512, 3, true);
    run_swiglu(dt, QuantType::NF4, true, 700, 14336, 2, false);  // x in global memory
  }
}

// A captured decode step of 4-bit and dense GEMVs (q/k/v, residual, SwiGLU, lone 4-bit and dense
// outputs) replayed twice gives the results of the same launches run uncaptured, bit for bit.
TEST(CudaFused, DecodeGemvGraphReplay) {
  NF4FLASH_REQUIRE_CUDA();
  const DType dt = DType::BF16;
  Backends b(dt);
  const int64_t H = 512, I = 1344, KV = 128, T = 2;
  QW q = make_q4(b, dt, QuantType::NF4, true, H, H, true), k = make_q4(b, dt, QuantType::NF4, true, KV, H, false),
     v = make_q4(b, dt, QuantType::NF4, true, KV, H, false), o = make_q4(b, dt, QuantType::NF4, true, H, H, false),
     gt = make_q4(b, dt, QuantType::NF4, true, I, H, false), up = make_q4(b, dt, QuantType::NF4, true, I, H, false),
     dn = make_q4(b, dt, QuantType::NF4, true, H, I, true), hd = make_q4(b, dt, QuantType::NF4, true, 777, H, false);
  DevAct x(*b.gpu, T, H), qa(*b.gpu, T, H), ka(*b.gpu, T, KV), va(*b.gpu, T, KV), r(*b.gpu, T, H), tmp(*b.gpu, T, H),
      gtmp(*b.gpu, T, I), ua(*b.gpu, T, I), lg(*b.gpu, T, 777, DType::F32), lg2(*b.gpu, T, 1000, DType::F32);
  const auto Wd = randn(size_t(1000 * H), 0.05f);
  auto dense = b.gpu->upload_dense(f32_tensor(Wd, {1000, H}), dt);
  const auto X = rounded(randn(size_t(T * H)), dt), R = rounded(randn(size_t(T * H)), dt);
  auto step = [&] {
    const Backend::LinearOut outs[3] = {{q.gpu.get(), q.bgpu.get(), qa.act}, {k.gpu.get(), nullptr, ka.act},
                                        {v.gpu.get(), nullptr, va.act}};
    b.gpu->linear_multi(x.act, outs, 3);
    b.gpu->linear_residual(qa.act, *o.gpu, nullptr, tmp.act, r.act);
    b.gpu->linear_swiglu(r.act, *gt.gpu, nullptr, *up.gpu, nullptr, gtmp.act, ua.act);
    b.gpu->linear_residual(ua.act, *dn.gpu, dn.bgpu.get(), tmp.act, r.act);
    b.gpu->linear(r.act, *hd.gpu, nullptr, lg.act);
    b.gpu->linear(r.act, *dense, nullptr, lg2.act);
  };
  auto outputs = [&] {
    return std::vector<std::vector<float>>{qa.get(), ka.get(), va.get(), r.get(), ua.get(), lg.get(), lg2.get()};
  };
  x.set(X);
  r.set(R);
  step();
  const auto eager = outputs();
  r.set(R);
  b.gpu->capture_begin();
  step();
  const int id = b.gpu->capture_end();
  for (int rep = 0; rep < 2; ++rep) {
    r.set(R);
    qa.poison();
    ua.poison();
    b.gpu->replay(id);
    b.gpu->sync();
    EXPECT_EQ(outputs(), eager) << "replay " << rep;
  }
}

// The fused tensor-core GEMM's multi-weight launches (prompt rows, CudaTuning::q4_gemm = fused):
// q/k/v in one launch and gate+up in one launch + silu_mul, against the CPU, each run twice bit for
// bit (the split tail's counters reset themselves): launches of less than a wave of blocks (every
// unit may split along K), more than a wave (the partial one splits), and the Llama-3-8B shapes
// at 512 rows (the automatic schedule where the decoder uses it).
TEST(CudaFused, GemmQ4Multi) {
  NF4FLASH_REQUIRE_CUDA();
  if (!cuda::gemm_q4_wgmma_supported())
    GTEST_SKIP() << "fused 4-bit GEMM: needs a compute capability 9.0 GPU and a build for sm_90a";
  const CudaTuning fused = tuning_with([](CudaTuning& t) { t.q4_gemm = Q4GemmMode::Fused; });
  for (DType dt : {DType::BF16, DType::F16}) {
    for (const MultiCase& c : {MultiCase{QuantType::NF4, true, 4096, {1024, 256, 256}, 100},
                               MultiCase{QuantType::NF4, false, 512, {100, 37, 37}, 33},
                               MultiCase{QuantType::FP4, true, 192, {2050, 512, 130}, 300},
                               MultiCase{QuantType::NF4, true, 1536, {333, 70}, 600},
                               MultiCase{QuantType::NF4, true, 512, {2100, 2100}, 300},
                               MultiCase{QuantType::FP4, false, 768, {2048, 700, 1500}, 290},
                               MultiCase{QuantType::NF4, true, 4096, {1024, 256, 256}, 32},
                               MultiCase{QuantType::NF4, true, 512, {2100, 2100}, 17}})
      run_multi(dt, c, fused);
    for (auto [type, dq, I, H, T, bias] : {std::tuple{QuantType::NF4, true, int64_t{1000}, int64_t{512}, int64_t{65}, true},
                                           std::tuple{QuantType::NF4, true, int64_t{2048}, int64_t{1024}, int64_t{257}, false},
                                           std::tuple{QuantType::FP4, false, int64_t{40}, int64_t{128}, int64_t{40}, false},
                                           std::tuple{QuantType::NF4, false, int64_t{200}, int64_t{256}, int64_t{700}, true},
                                           std::tuple{QuantType::NF4, true, int64_t{2100}, int64_t{512}, int64_t{300}, true},
                                           std::tuple{QuantType::NF4, true, int64_t{1000}, int64_t{1024}, int64_t{24}, false}})
      run_swiglu(dt, type, dq, I, H, T, bias, fused);
  }
  run_multi(DType::BF16, MultiCase{QuantType::NF4, true, 4096, {4096, 1024, 1024}, 512});
  run_swiglu(DType::BF16, QuantType::NF4, true, 14336, 4096, 512, false);
}

// inv_freq tables of head_dim hd and base theta on both backends, and the RopeParams over them.
struct BothRope {
  DevAct c, g;
  RopeParams rc, rg;
  BothRope(Backends& b, int hd, float theta) : c(*b.cpu, 1, hd / 2, DType::F32), g(*b.gpu, 1, hd / 2, DType::F32) {
    std::vector<float> inv(size_t(hd / 2));
    for (int i = 0; i < hd / 2; ++i) inv[size_t(i)] = std::pow(theta, -2.f * i / hd);
    c.set(inv);
    g.set(inv);
    rc = RopeParams{hd, static_cast<const float*>(c.act.data)};
    rg = RopeParams{hd, static_cast<const float*>(g.act.data)};
  }
};

// rope_kv_write, then attention over what it wrote (and the rotated q/k buffers) vs the CPU.
TEST(CudaFused, RopeKvWrite) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (int hd : {64, 128})
      for (auto [pos0, T] : {std::pair<int, int>{0, 1}, {37, 1}, {900, 3}, {0, 20}, {5, 300}}) {
        Backends b(dt);
        const int nq = 8, nk = 2, layers = 2, layer = 1;
        const int64_t cap = pos0 + T + 3;
        b.cpu->kv_allocate({layers, nk, hd, cap, DType::F32});
        b.gpu->kv_allocate({layers, nk, hd, cap, dt});
        BothRope rope(b, hd, 500000.f);
        const RopeParams &rc = rope.rc, &rg = rope.rg;
        auto step = [&](int p0, int n, bool check) {
          auto Q = rounded(randn(size_t(n * nq * hd)), dt), K = rounded(randn(size_t(n * nk * hd)), dt),
               V = rounded(randn(size_t(n * nk * hd)), dt);
          DevAct qc(*b.cpu, n, nq * hd), kc(*b.cpu, n, nk * hd), vc(*b.cpu, n, nk * hd);
          DevAct qg(*b.gpu, n, nq * hd), kg(*b.gpu, n, nk * hd), vg(*b.gpu, n, nk * hd);
          qc.set(Q); kc.set(K); vc.set(V); qg.set(Q); kg.set(K); vg.set(V);
          DevInts pc(*b.cpu, {p0}), pg(*b.gpu, {p0});
          b.cpu->rope_kv_write(layer, qc.act, kc.act, vc.act, rc, StepState{pc.ptr()});
          b.gpu->rope_kv_write(layer, qg.act, kg.act, vg.act, rg, StepState{pg.ptr()});
          if (!check) return;
          EXPECT_LT(rel_err(qg.get(), qc.get()), tol_for(dt)) << "rope_kv_write q hd " << hd << " pos0 " << p0;
          EXPECT_LT(rel_err(kg.get(), kc.get()), tol_for(dt)) << "rope_kv_write k hd " << hd << " pos0 " << p0;
          DevAct oc(*b.cpu, n, nq * hd), og(*b.gpu, n, nq * hd);
          og.poison();
          AttnParams ap{nq, nk, hd, 1.f / std::sqrt(float(hd)), AttnImpl::Auto};
          b.cpu->attention(layer, qc.act, oc.act, ap, StepState{pc.ptr()});
          b.gpu->attention(layer, qg.act, og.act, ap, StepState{pg.ptr()});
          EXPECT_LT(rel_err(og.get(), oc.get()), tol_for(dt)) << "attention after rope_kv_write hd " << hd
                                                           << " pos0 " << p0 << " T " << n;
        };
        if (pos0 > 0) step(0, pos0, false);
        step(pos0, T, true);
      }
}

// rope_kv_write with per-head q/k norms (one pass at head_dim 64/128/256; the norms' own launches
// at 96) equals rms_norm of each head then rope_kv_write bit for bit (q, k and the cache, read back
// through attention), and the CPU's composition within tolerance.
TEST(CudaFused, RopeKvWriteWithQkNormEqualsNormsThenRope) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (int hd : {64, 96, 128, 256})
      for (auto [pos0, T] : {std::pair<int, int>{0, 1}, {37, 1}, {3, 20}}) {
        SCOPED_TRACE(cat(dtype_name(dt), " hd ", hd, " pos0 ", pos0, " T ", T));
        Backends b(dt);
        const int nq = 8, nk = 2;
        const int64_t cap = pos0 + T + 3;
        b.cpu->kv_allocate({1, nk, hd, cap, DType::F32});
        b.gpu->kv_allocate({2, nk, hd, cap, dt});  // layer 0: fused, layer 1: norms then rope
        BothRope rope(b, hd, 1000000.f);
        const RopeParams &rc = rope.rc, &rg = rope.rg;
        auto Nq = randn(size_t(hd), 0.3f), Nk = randn(size_t(hd), 0.3f);
        for (float& w : Nq) w += 1.f;
        for (float& w : Nk) w += 1.f;
        auto nqc = b.cpu->upload_dense(f32_tensor(Nq, {hd}), DType::F32), nkc = b.cpu->upload_dense(f32_tensor(Nk, {hd}), DType::F32);
        auto nqg = b.gpu->upload_dense(f32_tensor(Nq, {hd}), dt), nkg = b.gpu->upload_dense(f32_tensor(Nk, {hd}), dt);
        const float eps = 1e-6f;
        const QkNorm qc_norm{nqc.get(), nkc.get(), eps}, qg_norm{nqg.get(), nkg.get(), eps};
        auto Q = rounded(randn(size_t(T * nq * hd), 2.f), dt), K = rounded(randn(size_t(T * nk * hd), 2.f), dt),
             V = rounded(randn(size_t(T * nk * hd)), dt);
        DevAct qc(*b.cpu, T, nq * hd), kc(*b.cpu, T, nk * hd), vc(*b.cpu, T, nk * hd);
        DevAct q0(*b.gpu, T, nq * hd), k0(*b.gpu, T, nk * hd), q1(*b.gpu, T, nq * hd), k1(*b.gpu, T, nk * hd),
            vg(*b.gpu, T, nk * hd);
        qc.set(Q); kc.set(K); vc.set(V); q0.set(Q); k0.set(K); q1.set(Q); k1.set(K); vg.set(V);
        DevInts pc(*b.cpu, {pos0}), pg(*b.gpu, {pos0});
        b.cpu->rope_kv_write(0, qc.act, kc.act, vc.act, rc, StepState{pc.ptr()}, qc_norm);
        b.gpu->rope_kv_write(0, q0.act, k0.act, vg.act, rg, StepState{pg.ptr()}, qg_norm);
        b.gpu->rms_norm(q1.act.reshaped(hd), *nqg, eps, q1.act.reshaped(hd));
        b.gpu->rms_norm(k1.act.reshaped(hd), *nkg, eps, k1.act.reshaped(hd));
        b.gpu->rope_kv_write(1, q1.act, k1.act, vg.act, rg, StepState{pg.ptr()});
        EXPECT_EQ(q0.get(), q1.get());
        EXPECT_EQ(k0.get(), k1.get());
        EXPECT_LT(rel_err(q0.get(), qc.get()), tol_for(dt));
        EXPECT_LT(rel_err(k0.get(), kc.get()), tol_for(dt));
        // the cache rows written (pos0 .. pos0 + T; the rows below are zero in both layers)
        AttnParams ap{nq, nk, hd, 1.f / std::sqrt(float(hd)), AttnImpl::Auto};
        DevAct o0(*b.gpu, T, nq * hd), o1(*b.gpu, T, nq * hd), oc(*b.cpu, T, nq * hd);
        o0.poison();
        o1.poison();
        b.gpu->attention(0, q0.act, o0.act, ap, StepState{pg.ptr()});
        b.gpu->attention(1, q1.act, o1.act, ap, StepState{pg.ptr()});
        b.cpu->attention(0, qc.act, oc.act, ap, StepState{pc.ptr()});
        EXPECT_EQ(o0.get(), o1.get());
        EXPECT_LT(rel_err(o0.get(), oc.get()), tol_for(dt));
      }
}

}  // namespace
}  // namespace nf4flash::test
