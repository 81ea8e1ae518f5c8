// nf4flash-kernel-bench: prefill attention, Backend::attention over a whole prompt (T = seq, pos0 = 0,
// causal, batch 1), Llama-3-8B layer shape (32 q heads, 8 kv heads, head_dim 128, bf16) at seq 4096
// and 16384, and Gemma-2-9B's (16 q heads, 8 kv heads, head_dim 256) at 4096, plain and with its
// attention soft-capping (50; PyTorch's SDPA has no soft-capping, so scripts/sdpa_bench.py --shape
// gemma2 times the plain product): the flash kernel (mma.sync, and wgmma + TMA where the build and GPU have it; each on a
// backend whose CudaTuning::flash_kernel names it), the CUDA-core "sdpa" kernel and eager (cuBLAS
// scores + softmax). Timed one call at a time (eager sizes its work from the host-known length, so it
// is not captured): one warm-up, then the median of max(5, trials) calls. TFLOP/s with the causal
// convention of FlashAttention's benchmarks, 4 * seq^2 / 2 * head_dim * n_heads, which
// scripts/sdpa_bench.py (PyTorch SDPA on the same shape) uses too.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/launchers.h"
#include "bench.h"
#include "core/error.h"

namespace nf4flash::kbench {
namespace {

struct Run {
  std::string label;  // "flash-mma", "flash-wgmma", "sdpa", "eager"
  Backend* be;
  AttnImpl impl;
};

struct Shape {
  const char* name;
  int nh, nkv, hd;
  std::vector<int> seqs;
  std::vector<float> softcaps;  // 0: none
};

void prefill_attention_shape(Context& c, const Shape& sh) {
  const int nh = sh.nh, nkv = sh.nkv, hd = sh.hd, trials = std::max(5, c.trials);
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Run> runs;
  owned.push_back(c.backend_with([](CudaTuning& t) { t.flash_kernel = FlashKernelChoice::Mma; }));
  runs.push_back({"flash-mma", owned.back().get(), AttnImpl::Flash});
  if (cuda::attention_flash_wgmma_supported()) {
    owned.push_back(c.backend_with([](CudaTuning& t) { t.flash_kernel = FlashKernelChoice::Wgmma; }));
    runs.push_back({"flash-wgmma", owned.back().get(), AttnImpl::Flash});
  }
  runs.push_back({"sdpa", &c.be, AttnImpl::Sdpa});
  runs.push_back({"eager", &c.be, AttnImpl::Eager});
  const std::string default_flash = c.be.attn_path(AttnImpl::Flash);

  for (int seq : sh.seqs) {
    auto qb = randn_bf16(c.be, size_t(seq) * nh * hd, c.rng), ob = c.be.alloc(size_t(seq) * nh * hd * 2);
    auto pb = c.be.alloc(4);
    const int32_t zero = 0;
    c.be.upload(pb->data(), &zero, 4);
    const StepState st{static_cast<int32_t*>(pb->data()), 0};
    const Act q = qb->as_act(DType::BF16, seq, nh * hd), o = ob->as_act(DType::BF16, seq, nh * hd);
    const Act kv = qb->as_act(DType::BF16, seq, nkv * hd);  // K = V = the first seq*nkv*hd values of q
    c.be.sync();
    std::vector<Backend*> filled;
    for (const Run& r : runs) {
      if (std::find(filled.begin(), filled.end(), r.be) != filled.end()) continue;
      r.be->kv_allocate({1, nkv, hd, seq, DType::BF16});
      r.be->kv_write(0, kv, kv, st);
      r.be->sync();
      filled.push_back(r.be);
    }
    const double flops = 4.0 * double(seq) * seq / 2 * hd * nh;
    for (const float cap : sh.softcaps) {
      for (const Run& r : runs) {
        const std::string why = r.be->attn_unsupported_reason(r.impl, hd);
        if (!why.empty()) {
          std::printf("attn prefill %s seq=%d: skipped (%s)\n", r.label.c_str(), seq, why.c_str());
          continue;
        }
        AttnParams ap{nh, nkv, hd, 1.f / std::sqrt(float(hd)), r.impl};
        ap.softcap = cap;
        const double sec = time_calls(*r.be, [&] { r.be->attention(0, q, o, ap, st); }, trials);
        const std::string path = r.be->attn_path(r.impl);
        c.report.row(cat("attn prefill ", r.label, " ", sh.name, cap > 0 ? cat(" softcap ", cap) : std::string(),
                         " seq=", seq),
                     sec, 0, flops,
                     {{"impl", r.label}, {"path", path}, {"default", r.impl == AttnImpl::Flash && path == default_flash},
                      {"shape", sh.name}, {"seq", seq}, {"n_heads", nh}, {"n_kv_heads", nkv}, {"head_dim", hd},
                      {"softcap", cap}, {"dtype", "bf16"}, {"causal", true}, {"ms", sec * 1e3}, {"trials", trials}});
      }
    }
  }
  c.be.kv_allocate({0, nkv, hd, 0, DType::BF16});  // the cache's memory back
  for (auto& b : owned) b->kv_allocate({0, nkv, hd, 0, DType::BF16});
}

}  // namespace

void prefill_attention(Context& c) {
  c.report.section("prefill_attention",
                   "prefill attention (causal, bf16): llama3-8b 32 q / 8 kv heads hd 128; gemma2-9b 16 / 8 hd 256");
  prefill_attention_shape(c, {"llama3-8b", 32, 8, 128, {4096, 16384}, {0.f}});
  prefill_attention_shape(c, {"gemma2-9b", 16, 8, 256, {4096}, {0.f, 50.f}});
}

}  // namespace nf4flash::kbench
