// MoeBlock on the CPU backend (host routing): with residual, the block's output is added to out
// exactly as add() adds it (f32: out + y), the rows routed alike.
#include <gtest/gtest.h>

#include <cmath>

#include "model/moe.h"
#include "ops/cuda_test_util.h"

namespace nf4flash::test {
namespace {

TEST(MoeBlock, ResidualAddsTheBlockToOut) {
  auto be = make_cpu_backend({DType::F32, 1});
  const int64_t H = 64, I = 32, T = 3;
  const int E = 6, K = 2;
  const ModelConfig cfg = moe_test_config(H, E, K, I, true);
  MoeWeights w;
  w.router = be->upload_dense(f32_tensor(randn(size_t(E * H), 0.5f), {E, H}), DType::F32);
  auto dense = [&](int64_t rows, int64_t cols) {
    return be->upload_dense(f32_tensor(randn(size_t(rows * cols), 0.1f), {rows, cols}), DType::F32);
  };
  for (int e = 0; e < E; ++e) w.experts.push_back({dense(I, H), dense(I, H), dense(H, I)});
  ASSERT_FALSE(w.set) << "the CPU backend routes on the host";
  MoeBlock blk(*be, cfg);
  const auto r0 = randn(size_t(T * H));
  DevAct x(*be, T, H), y(*be, T, H), r(*be, T, H);
  x.set(randn(size_t(T * H)));
  r.set(r0);
  blk.forward(x.act, w, y.act);
  blk.forward(x.act, w, r.act, true);
  const auto yh = y.get(), rh = r.get();
  double moved = 0;
  for (size_t i = 0; i < yh.size(); ++i) {
    EXPECT_EQ(rh[i], r0[i] + yh[i]) << i;
    moved += std::abs(yh[i]);
  }
  EXPECT_GT(moved, 0.0) << "the block's output is not all zero";
}

}  // namespace
}  // namespace nf4flash::test
