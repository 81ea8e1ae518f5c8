// The three CUDA attention paths (--attn flash | sdpa | eager) against the CPU f32 reference on fresh
// random inputs: causal, GQA (32/8, 8/2, 14/2, 4/4, 4/2), head_dim 32, 64, 80, 96, 128 and 256,
// T = 1 .. 4096 rows, starting at pos0 = 0 and continuing an existing cache (pos0 = 300), with and
// without a sliding window and soft-capping; bf16 and f16 compute (eager also f32). Inputs are rounded to bf16 once (exact in f16 and f32 too), so one CPU reference
// serves every dtype and path. Also: eager inside a captured graph (key length = the capacity,
// positions from device memory), and the refusals by name.
#include "backend/cuda/launchers.h"
#include "core/error.h"
#include "ops/cuda_test_util.h"

namespace nf4flash::test {
namespace {

struct Case {
  int n_heads, n_kv, hd, pos0, T;
  float softcap = 0.f;
  int window = 0;
};

const char* impl_str(AttnImpl a) { return a == AttnImpl::Flash ? "flash" : a == AttnImpl::Sdpa ? "sdpa" : "eager"; }

// One backend with its KV cache holding keys/values for positions [0, pos0 + T).
struct Side {
  std::unique_ptr<Backend> be;
  Side(std::unique_ptr<Backend> b, const Case& c, const std::vector<float>& K, const std::vector<float>& V,
       DType kv_dtype)
      : be(std::move(b)) {
    const int64_t n = c.pos0 + c.T, kvw = int64_t(c.n_kv) * c.hd;
    be->kv_allocate({2, c.n_kv, c.hd, n + 7, kv_dtype});
    DevAct k(*be, n, kvw), v(*be, n, kvw);
    k.set(K);
    v.set(V);
    DevInts p(*be, {0});
    be->kv_write(1, k.act, v.act, StepState{p.ptr(), 0});
    be->sync();
  }
};

void run_case(const Case& c) {
  const int64_t n = c.pos0 + c.T, kvw = int64_t(c.n_kv) * c.hd, qw = int64_t(c.n_heads) * c.hd;
  const auto K = rounded(randn(size_t(n * kvw)), DType::BF16), V = rounded(randn(size_t(n * kvw)), DType::BF16);
  const auto Q = rounded(randn(size_t(c.T * qw), 2.f), DType::BF16);
  AttnParams p{c.n_heads, c.n_kv, c.hd, 1.f / std::sqrt(float(c.hd)), AttnImpl::Auto};
  p.softcap = c.softcap;
  p.window = c.window;
  std::vector<float> ref;
  {
    Side cpu(make_cpu_backend({DType::F32, 0}), c, K, V, DType::F32);
    DevAct q(*cpu.be, c.T, qw), o(*cpu.be, c.T, qw);
    q.set(Q);
    DevInts pos(*cpu.be, {c.pos0});
    cpu.be->attention(1, q.act, o.act, p, StepState{pos.ptr(), c.pos0});
    ref = o.get();
  }
  // flash: the mma.sync kernel (every GPU) and, on Hopper builds, the wgmma one, each selected through
  // CudaTuning::flash_kernel
  std::vector<FlashKernelChoice> kernels = {FlashKernelChoice::Mma};
  if (cuda::attention_flash_wgmma_supported()) kernels.push_back(FlashKernelChoice::Wgmma);
  for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
    for (FlashKernelChoice kern : kernels) {
      CudaBackendOptions bo;
      bo.compute = dt;
      bo.tuning = tuning_with([&](CudaTuning& t) { t.flash_kernel = kern; });
      Side gpu(make_cuda_backend(bo), c, K, V, dt);
      DevAct q(*gpu.be, c.T, qw), o(*gpu.be, c.T, qw);
      q.set(Q);
      DevInts pos(*gpu.be, {c.pos0});
      for (AttnImpl impl : {AttnImpl::Flash, AttnImpl::Sdpa, AttnImpl::Eager}) {
        if (dt == DType::F32 && impl != AttnImpl::Eager) continue;  // sdpa f32 is covered in test_cuda_ops
        if (impl != AttnImpl::Flash && kern != kernels[0]) continue;  // the kernel choice is flash's alone
        AttnParams pi = p;
        pi.impl = impl;
        // eager: with the host-known length, and (short cases) over the whole capacity as in a graph
        for (int64_t host : {int64_t(c.pos0), int64_t(-1)}) {
          if (host < 0 && (impl != AttnImpl::Eager || c.T > 128)) continue;
          o.poison();
          gpu.be->attention(1, q.act, o.act, pi, StepState{pos.ptr(), host});
          EXPECT_LT(rel_err(o.get(), ref), tol_for(dt))
              << impl_str(impl)
              << (impl == AttnImpl::Flash ? cat(" (", mma_kernel_choice_name(kern), ")") : std::string()) << " "
              << dtype_name(dt) << " heads " << c.n_heads << "/" << c.n_kv << " hd " << c.hd << " pos0 " << c.pos0
              << " T " << c.T << " softcap " << c.softcap << " window " << c.window
              << (host < 0 ? " (length = capacity)" : "");
        }
      }
    }
  }
}

TEST(CudaAttention, PathsMatchCpu) {
  NF4FLASH_REQUIRE_CUDA();
  const Case heads[] = {{32, 8, 0, 0, 0}, {8, 2, 0, 0, 0}, {14, 2, 0, 0, 0}, {4, 4, 0, 0, 0}};
  int k = 0;
  for (int T : {1, 17, 128, 1000})
    for (int pos0 : {0, 300})
      for (int hd : {64, 128}) {
        const Case& h = heads[k++ % 4];
        run_case({h.n_heads, h.n_kv, hd, pos0, T});
      }
}

// The head dims of Phi-3 (96), Gemma (256), small Mistral-style models (32) and others (80),
// decode (T <= 4) and prompt rows, and Gemma 2's soft-capping and sliding window on every path
// (windows shorter than, across and longer than the tiles).
TEST(CudaAttention, EveryHeadDimWindowAndSoftcap) {
  NF4FLASH_REQUIRE_CUDA();
  for (int hd : {32, 80, 96, 256})
    for (int T : {1, 4, 200})
      for (int pos0 : {0, 300}) run_case({4, 2, hd, pos0, T});
  for (int hd : {64, 128, 256, 96}) {
    run_case({4, 2, hd, 0, 300, 5.f, 0});      // soft-capped (a cap near the scores: tanh bends them)
    run_case({8, 2, hd, 0, 700, 0.f, 100});    // window inside the prompt
    run_case({8, 2, hd, 300, 3, 0.f, 16});     // decode rows, window shorter than a split
    run_case({4, 1, hd, 300, 400, 5.f, 257});  // both, a window across tiles, continuing a cache
  }
  run_case({4, 4, 128, 0, 4096, 0.f, 1000});   // a long prompt, many tiles skipped
  run_case({4, 2, 64, 100, 50, 0.f, 4096});    // a window longer than the context: all visible
}

TEST(CudaAttention, LongPrompts) {
  NF4FLASH_REQUIRE_CUDA();
  run_case({4, 2, 128, 0, 4096});
  run_case({4, 2, 64, 300, 4096});
  run_case({8, 8, 128, 1, 300});  // short pos0, T not a multiple of the tiles
}

// A captured eager decode step replays at other positions (pos0 only in device memory).
TEST(CudaAttention, EagerCapturedDecode) {
  NF4FLASH_REQUIRE_CUDA();
  const Case c{8, 2, 128, 0, 500};
  const int64_t kvw = int64_t(c.n_kv) * c.hd, qw = int64_t(c.n_heads) * c.hd;
  const auto K = rounded(randn(size_t(c.T * kvw)), DType::BF16), V = rounded(randn(size_t(c.T * kvw)), DType::BF16);
  const auto Q = rounded(randn(size_t(qw), 2.f), DType::BF16);
  Side cpu(make_cpu_backend({DType::F32, 0}), c, K, V, DType::F32);
  Side gpu(make_cuda_backend({}), c, K, V, DType::BF16);
  DevAct qc(*cpu.be, 1, qw), oc(*cpu.be, 1, qw), qg(*gpu.be, 1, qw), og(*gpu.be, 1, qw);
  qc.set(Q);
  qg.set(Q);
  DevInts pc(*cpu.be, {0}), pg(*gpu.be, {0});
  AttnParams p{c.n_heads, c.n_kv, c.hd, 1.f / std::sqrt(float(c.hd)), AttnImpl::Eager};
  gpu.be->attention(1, qg.act, og.act, p, StepState{pg.ptr(), 0});  // uncaptured first: sizes the buffer
  gpu.be->sync();
  gpu.be->capture_begin();
  gpu.be->attention(1, qg.act, og.act, p, StepState{pg.ptr(), -1});
  const int id = gpu.be->capture_end();
  for (int32_t pos : {0, 137, 499}) {
    gpu.be->upload(pg.ptr(), &pos, 4);
    cpu.be->upload(pc.ptr(), &pos, 4);
    og.poison();
    gpu.be->replay(id);
    cpu.be->attention(1, qc.act, oc.act, AttnParams{c.n_heads, c.n_kv, c.hd, p.scale, AttnImpl::Auto},
                      StepState{pc.ptr(), pos});
    EXPECT_LT(rel_err(og.get(), oc.get()), tol_for(DType::BF16)) << "captured eager decode at pos " << pos;
  }
}

TEST(CudaAttention, Refusals) {
  NF4FLASH_REQUIRE_CUDA();
  CudaBackendOptions bo;
  bo.compute = DType::F32;
  auto f32 = make_cuda_backend(bo);
  const std::string why = f32->attn_unsupported_reason(AttnImpl::Flash, 128);
  EXPECT_NE(why.find("flash"), std::string::npos) << why;
  EXPECT_NE(why.find("bf16"), std::string::npos) << why;
  EXPECT_EQ(f32->attn_unsupported_reason(AttnImpl::Sdpa, 128), "");
  EXPECT_EQ(f32->attn_unsupported_reason(AttnImpl::Eager, 64), "");
  auto bf = make_cuda_backend({});
  for (AttnImpl a : {AttnImpl::Flash, AttnImpl::Sdpa, AttnImpl::Eager, AttnImpl::Auto})
    EXPECT_NE(bf->attn_unsupported_reason(a, 48).find("48"), std::string::npos);
  for (AttnImpl a : {AttnImpl::Flash, AttnImpl::Sdpa, AttnImpl::Eager}) EXPECT_EQ(bf->attn_unsupported_reason(a, 128), "");
  // calling attention anyway fails with the reason, not a fallback
  f32->kv_allocate({1, 2, 128, 64, DType::F32});
  DevAct q(*f32, 8, 4 * 128), o(*f32, 8, 4 * 128);
  DevInts pos(*f32, {0});
  try {
    f32->attention(0, q.act, o.act, AttnParams{4, 2, 128, 0.1f, AttnImpl::Flash}, StepState{pos.ptr(), 0});
    ADD_FAILURE() << "flash with f32 compute did not throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("flash"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nf4flash::test
