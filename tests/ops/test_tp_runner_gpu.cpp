// The tensor-parallel step runner on CUDA (parallel/tp_step.h), as every rank runs it: single-token
// steps on the contiguous cache replay one captured graph (recaptured when the KV cache moves), and
// give the engine's own graphed decode steps bit for bit; prefill steps and paged steps run the
// decoder's ops. (The collectives of several ranks need several GPUs; the sharding is checked over
// CPU ranks in test_tensor_parallel.cpp and across processes in test_cli_tensor_parallel.cpp.)
#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "model_checks_gpu.h"
#include "parallel/tp_step.h"
#include "runtime/engine_impl.h"

using namespace nf4flash;
using namespace nf4flash::test;

TEST(GpuTpRunner, GraphedStepsEqualTheEngineDecode) {
  NF4FLASH_REQUIRE_CUDA();
  for (const GpuCase& c : {GpuCase{"llama-gqa-hd64", "bf16", "", QuantChoice::None, false, ComputeDType::BF16},
                           GpuCase{"qwen3moe-topk", "nf4", "", QuantChoice::NF4, true, ComputeDType::BF16}}) {
    SCOPED_TRACE(c.model);
    Golden g(c.model);
    const auto toks = g.i32("tokens_1");
    auto a = load_gpu(c), b = load_gpu(c);
    Engine::Impl& ia = a->internals();
    Engine::Impl& ib = b->internals();
    TpStepRunner runner(*ib.dec, *ib.be);
    runner.set_graphs(true);
    const int64_t V = a->vocab_size(), k = 9;
    ia.forward_tokens(toks.data(), k, 0, false, [](int64_t, Act) {});
    TpStep pre;
    pre.ids.assign(toks.begin(), toks.begin() + k);
    runner.run(pre, runner.scratch_logits(1));
    std::vector<float> ra(V), rb(V);
    for (int64_t p = k; p < int64_t(toks.size()); ++p) {
      if (p == k + 3) {  // a new cache: both recapture
        ia.kv_allocate();
        ib.kv_allocate();
        ia.forward_tokens(toks.data(), p, 0, false, [](int64_t, Act) {});
        pre.ids.assign(toks.begin(), toks.begin() + p);
        runner.run(pre, runner.scratch_logits(1));
      }
      ia.decode_step(toks[size_t(p)], p);
      TpStep s;
      s.ids = {toks[size_t(p)]};
      s.pos0 = int32_t(p);
      const Act lg = runner.scratch_logits(1);
      runner.run(s, lg);
      ia.be->download(ra.data(), ia.logits_act(1).data, size_t(V) * 4);
      ib.be->download(rb.data(), lg.data, size_t(V) * 4);
      ASSERT_EQ(ra, rb) << "position " << p;
    }
  }
}
