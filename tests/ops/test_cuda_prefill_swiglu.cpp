// linear_swiglu for long prompt chunks on the dequantize + cuBLAS path without the [T, I] gate
// buffer (CudaBackend::swiglu_sliced): gate and up multiplied one chunk of weight rows at a time,
// the gate chunk's product in a [T, chunk] scratch, silu_mul_cols into the output's column slice.
// Fresh random NF4-dq weights, 1 MiB chunks so a small weight spans several (the last one
// shorter), T at the row threshold (2048); against the same op with the gate buffer and the CPU.
#include "core/error.h"
#include "ops/cuda_test_util.h"
#include "quant/blockwise.h"


namespace nf4flash::test {
namespace {

std::unique_ptr<Weight> q4_on(Backend& be, const std::shared_ptr<Quant4Tensor>& q) { return be.upload_quant4(q); }

TEST(CudaPrefill, SwiGLUWithoutGateBuffer) {
  NF4FLASH_REQUIRE_CUDA();
  Backends b(DType::BF16, tuning_with([](CudaTuning& t) { t.dequant_chunk_mb = 1; }));
  const int64_t I = 2504, H = 512, T = 2048;  // 1 MiB / (512 x 2 B) = 1024 rows a chunk: 1024, 1024, 456
  auto mk = [&] {
    auto W = randn(size_t(I * H), 0.05f);
    return std::make_shared<Quant4Tensor>(quantize_4bit(W.data(), DType::F32, I, H, QuantType::NF4, 64, true));
  };
  auto qg = mk(), qu = mk();
  auto gg = q4_on(*b.gpu, qg), ug = q4_on(*b.gpu, qu), gc = q4_on(*b.cpu, qg), uc = q4_on(*b.cpu, qu);
  EXPECT_FALSE(b.gpu->linear_swiglu_needs_tmp(*gg, *ug, T, false));
  EXPECT_TRUE(b.gpu->linear_swiglu_needs_tmp(*gg, *ug, T - 1, false));  // below the chunking threshold
  EXPECT_TRUE(b.gpu->linear_swiglu_needs_tmp(*gg, *ug, T, true));       // bias: the unsliced path
  EXPECT_TRUE(b.cpu->linear_swiglu_needs_tmp(*gc, *uc, T, false));

  auto X = rounded(randn(size_t(T * H)), DType::BF16);
  DevAct xg(*b.gpu, T, H), xc(*b.cpu, T, H), tg(*b.gpu, T, I), tc(*b.cpu, T, I), og(*b.gpu, T, I), os(*b.gpu, T, I),
      oc(*b.cpu, T, I);
  xg.set(X);
  xc.set(X);
  og.poison();
  os.poison();
  b.gpu->linear_swiglu(xg.act, *gg, nullptr, *ug, nullptr, tg.act, og.act);
  b.gpu->linear_swiglu(xg.act, *gg, nullptr, *ug, nullptr, Act{nullptr, DType::BF16, T, I}, os.act);
  b.cpu->linear_swiglu(xc.act, *gc, nullptr, *uc, nullptr, tc.act, oc.act);
  const auto sliced = os.get();
  EXPECT_LT(rel_err(sliced, og.get()), 1e-3) << "without the gate buffer vs with it";
  EXPECT_LT(rel_err(sliced, oc.get()), 1e-2) << "against the CPU";
  // a shape that needs the buffer, called without it: one error line, no crash
  EXPECT_THROW(b.gpu->linear_swiglu(xg.act.slice_rows(0, 100), *gg, nullptr, *ug, nullptr,
                                    Act{nullptr, DType::BF16, 100, I}, os.act.slice_rows(0, 100)),
               Error);
}

}  // namespace
}  // namespace nf4flash::test
