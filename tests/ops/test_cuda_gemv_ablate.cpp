// kernel-bench's ablations. The speed-of-light forms of the 4-bit decode GEMV (CudaBackendOptions::gemv_ablate):
// each is the default kernel (h8u4d3, T = 1) with one cost taken out, timed by kernel-bench and wrong
// by design. What is tested: the ablation takes effect (the no-absmax form computes exactly the
// products of a weight whose absmax are all 1; the others differ from the real GEMV), it is
// repeatable (no unset memory read: two launches give the same bytes), it is named in linear_path,
// and everything it is not built for is refused with an error instead of running unablated.
// The empty-launch guard (cuda::EmptyLaunches): inside it a launch does no work, and the guard
// ends with its scope (nested guards restore the outer state).
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "ops/cuda_test_util.h"

namespace nf4flash::test {
namespace {

std::unique_ptr<Backend> ablated_backend(int mask, DType dt = DType::BF16) {
  CudaBackendOptions o;
  o.compute = dt;
  o.gemv_ablate = mask;
  return make_cuda_backend(o);
}

std::vector<uint8_t> raw_bytes(const DevAct& a) {
  std::vector<uint8_t> h(a.act.bytes());
  a.be->download(h.data(), a.act.data, h.size());
  return h;
}

TEST(CudaGemvAblate, TakesEffectRepeatsAndRefuses) {
  NF4FLASH_REQUIRE_CUDA();
  CudaBackendOptions po;
  auto plain = make_cuda_backend(po);
  const int64_t N = 1000, K = 4096;  // 63 row tiles, 64 column tiles (2 batches of 32 per item)
  auto q = random_quant4(N, K, QuantType::NF4, true);
  // the same codes with every absmax 1 (single quant): what the no-absmax ablation computes
  auto q1 = std::make_shared<Quant4Tensor>(*q);
  q1->double_quant = false;
  q1->absmax.assign(size_t(q->num_blocks()), 1.f);
  q1->absmax_q.clear();
  q1->nested_absmax.clear();
  q1->absmax_f32.clear();
  auto w = plain->upload_quant4(q), w1 = plain->upload_quant4(q1);
  DevAct x(*plain, 1, K), yref(*plain, 1, N), y1(*plain, 1, N);
  x.set(rounded(randn(size_t(K)), DType::BF16));
  plain->linear(x.act, *w, nullptr, yref.act);
  plain->linear(x.act, *w1, nullptr, y1.act);
  const auto ref = yref.get(), ref1 = y1.get();

  for (int mask : {1, 2, 7}) {
    SCOPED_TRACE(cat("gemv_ablate ", mask));
    auto ab = ablated_backend(mask);
    EXPECT_NE(ab->linear_path(*w, 1).find("ABLATED"), std::string::npos) << ab->linear_path(*w, 1);
    // the weights, x and y of the plain backend, as kernel-bench times them (non-blocking streams)
    DevAct ya(*plain, 1, N), yb(*plain, 1, N);
    ya.poison();
    yb.poison();
    ab->linear(x.act, *w, nullptr, ya.act);
    ab->linear(x.act, *w, nullptr, yb.act);
    ab->sync();  // its own stream; the bytes are read through the plain backend's
    const auto a = raw_bytes(ya);
    EXPECT_EQ(a, raw_bytes(yb)) << "two launches of the ablated kernel differ";
    EXPECT_NE(a, std::vector<uint8_t>(a.size(), 0xff)) << "the ablated kernel wrote nothing";
    EXPECT_NE(ya.get(), ref) << "the ablation did not take effect";
    if (mask == 2) EXPECT_LT(rel_err(ya.get(), ref1), 2e-3) << "no absmax: the products of absmax 1";
    // refused: T > 1, the rows the dequantize + GEMM path takes, single quant, f16, a mask not built
    for (int64_t T : {2, 64}) {
      DevAct xt(*plain, T, K), yt(*plain, T, N);
      EXPECT_THROW(ab->linear(xt.act, *w, nullptr, yt.act), Error) << "T=" << T;
    }
    EXPECT_THROW(ab->linear(x.act, *w1, nullptr, ya.act), Error) << "single quant";
  }
  auto abf16 = ablated_backend(1, DType::F16);
  auto wf = abf16->upload_quant4(q);
  DevAct xf(*abf16, 1, K), yf(*abf16, 1, N);
  xf.set(rounded(randn(size_t(K)), DType::F16));
  EXPECT_THROW(abf16->linear(xf.act, *wf, nullptr, yf.act), Error) << "f16";
  for (int mask : {3, 4, 8, -1}) EXPECT_THROW(ablated_backend(mask), Error) << "gemv_ablate " << mask;
}

TEST(CudaEmptyLaunches, NoWorkInsideTheGuardOnly) {
  NF4FLASH_REQUIRE_CUDA();
  CudaBackendOptions o;
  auto be = make_cuda_backend(o);
  const int64_t H = 4096;
  auto wn = be->upload_dense(f32_tensor(randn(size_t(H)), {H}), DType::BF16);
  DevAct x(*be, 1, H), y(*be, 1, H);
  x.set(rounded(randn(size_t(H)), DType::BF16));
  const std::vector<uint8_t> poison(y.act.bytes(), 0xff);
  y.poison();
  {
    cuda::EmptyLaunches outer;
    EXPECT_TRUE(cuda::empty_launches());
    {
      cuda::EmptyLaunches off(false);  // a guard that is off leaves the outer one on
      EXPECT_TRUE(cuda::empty_launches());
    }
    be->rms_norm(x.act, *wn, 1e-5f, y.act);
    be->sync();
    EXPECT_EQ(raw_bytes(y), poison) << "an empty launch wrote its output";
  }
  EXPECT_FALSE(cuda::empty_launches());
  be->rms_norm(x.act, *wn, 1e-5f, y.act);
  be->sync();
  EXPECT_NE(raw_bytes(y), poison) << "the launch after the guard did no work";
}

}  // namespace
}  // namespace nf4flash::test
