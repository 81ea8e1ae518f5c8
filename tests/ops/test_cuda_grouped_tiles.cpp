// kernel-bench's grouped 4-bit tile layout (CudaBackendOptions::q4_tile_group = 32, Q4Device::
// tile_group): the lean decode GEMV at T = 1 reads the same tiles from other addresses, so every
// output is bit for bit what the tile16x64 layout gives (a lone weight, q/k/v in one launch,
// gate+up+SiLU, a residual), and every other 4-bit path refuses such a weight with an error.
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/cuda_test_util.h"

namespace nf4flash::test {
namespace {

struct Pair {
  std::unique_ptr<Backend> plain, grouped;
  explicit Pair(DType dt) {
    CudaBackendOptions o;
    o.compute = dt;
    plain = make_cuda_backend(o);
    o.q4_tile_group = 32;
    grouped = make_cuda_backend(o);
  }
};

// x [T, K] set alike on both backends
struct XPair {
  DevAct p, g;
  XPair(Pair& b, DType dt, int64_t T, int64_t K) : p(*b.plain, T, K), g(*b.grouped, T, K) {
    const auto X = rounded(randn(size_t(T * K)), dt);
    p.set(X);
    g.set(X);
  }
};

TEST(CudaGroupedTiles, LeanGemvBitExact) {
  NF4FLASH_REQUIRE_CUDA();
  for (DType dt : {DType::BF16, DType::F16})
    for (bool dq : {true, false}) {
      SCOPED_TRACE(cat(dtype_name(dt), dq ? " nf4-dq" : " nf4"));
      Pair b(dt);
      // lone weights: one group of 32 column tiles, 19 row tiles in 2 groups, 3 groups
      for (auto [N, K] : {std::pair<int64_t, int64_t>{64, 2048}, {300, 4096}, {1000, 6144}}) {
        auto q = random_quant4(N, K, QuantType::NF4, dq);
        auto wp = b.plain->upload_quant4(q), wg = b.grouped->upload_quant4(q);
        XPair x(b, dt, 1, K);
        DevAct yp(*b.plain, 1, N), yg(*b.grouped, 1, N);
        yg.poison();
        b.plain->linear(x.p.act, *wp, nullptr, yp.act);
        b.grouped->linear(x.g.act, *wg, nullptr, yg.act);
        EXPECT_EQ(yg.get(), yp.get()) << "linear " << N << "x" << K;
        EXPECT_NE(b.grouped->linear_path(*wg, 1).find("groups of 32"), std::string::npos) << b.grouped->linear_path(*wg, 1);
        // T = 2 (the lean kernel's T > 1 forms) and T = 64 (dequantize + GEMM) refuse the layout
        for (int64_t T : {2, 64}) {
          DevAct xt(*b.grouped, T, K), yt(*b.grouped, T, N);
          EXPECT_THROW(b.grouped->linear(xt.act, *wg, nullptr, yt.act), Error) << "T=" << T;
        }
      }
      // q/k/v in one launch (segments of different row tiles), gate+up+SiLU, a residual
      const int64_t H = 2048, KV = 256, I = 1536;
      auto q4 = [&](int64_t N, int64_t K) { return random_quant4(N, K, QuantType::NF4, dq); };
      // q, k, v, gate, up, down
      const std::shared_ptr<Quant4Tensor> qs[6] = {q4(H, H), q4(KV, H), q4(KV, H), q4(I, H), q4(I, H), q4(H, I)};
      std::unique_ptr<Weight> wp[6], wg[6];
      for (int i = 0; i < 6; ++i) wp[i] = b.plain->upload_quant4(qs[i]), wg[i] = b.grouped->upload_quant4(qs[i]);
      XPair x(b, dt, 1, H);
      DevAct qp(*b.plain, 1, H), kp(*b.plain, 1, KV), vp(*b.plain, 1, KV);
      DevAct qgd(*b.grouped, 1, H), kg(*b.grouped, 1, KV), vg(*b.grouped, 1, KV);
      const Backend::LinearOut op[3] = {{wp[0].get(), nullptr, qp.act}, {wp[1].get(), nullptr, kp.act},
                                        {wp[2].get(), nullptr, vp.act}};
      const Backend::LinearOut og[3] = {{wg[0].get(), nullptr, qgd.act}, {wg[1].get(), nullptr, kg.act},
                                        {wg[2].get(), nullptr, vg.act}};
      b.plain->linear_multi(x.p.act, op, 3);
      b.grouped->linear_multi(x.g.act, og, 3);
      EXPECT_EQ(qgd.get(), qp.get()) << "q/k/v: q";
      EXPECT_EQ(kg.get(), kp.get()) << "q/k/v: k";
      EXPECT_EQ(vg.get(), vp.get()) << "q/k/v: v";
      DevAct tp(*b.plain, 1, I), up(*b.plain, 1, I), tg(*b.grouped, 1, I), ug(*b.grouped, 1, I);
      b.plain->linear_swiglu(x.p.act, *wp[3], nullptr, *wp[4], nullptr, tp.act, up.act);
      b.grouped->linear_swiglu(x.g.act, *wg[3], nullptr, *wg[4], nullptr, tg.act, ug.act);
      EXPECT_EQ(ug.get(), up.get()) << "gate+up+silu";
      XPair r(b, dt, 1, H);
      DevAct dp(*b.plain, 1, H), dg(*b.grouped, 1, H);
      b.plain->linear_residual(up.act, *wp[5], nullptr, dp.act, r.p.act);
      b.grouped->linear_residual(ug.act, *wg[5], nullptr, dg.act, r.g.act);
      EXPECT_EQ(r.g.get(), r.p.get()) << "down + residual";
    }
}

}  // namespace
}  // namespace nf4flash::test
