// Host side of the L2 weight prefetch of captured decode steps (device side and the stream model:
// kernels/l2_prefetch.cuh). While a step is captured, every prefetching GEMV launch registers the
// weights it reads (add); at the end of the capture their offsets in the virtual weight stream are
// laid out in launch order and the table is uploaded, one table per graph (alive with it).
// NF4FLASH_L2_PREFETCH_MB sets the distance; off by default (measured slower on the H200,
// docs/performance.md "Seventh session").
#pragma once
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda_impl {

class L2PrefetchPlan {
 public:
  static constexpr int64_t kCap = 4096;  // launches per captured step

  // The distance in bytes the next capture will use (0: off), at most 3/4 of the L2.
  static int64_t configured_bytes(int64_t l2_bytes) {
    int64_t d = 0;
    if (const char* v = std::getenv("NF4FLASH_L2_PREFETCH_MB"); v && *v) d = int64_t(std::clamp(std::atoi(v), 0, 4096)) << 20;
    return std::min<int64_t>(d, l2_bytes * 3 / 4);
  }

  void begin(int64_t l2_bytes, int cc_major) {
    dist_ = configured_bytes(l2_bytes);
    recording_ = dist_ > 0 && cc_major >= 9;  // cp.async.bulk.prefetch needs sm_90
    plan_.clear();
    if (!recording_) return;
    const size_t bytes = size_t(kCap + cuda::kPfLookHost) * sizeof(cuda::L2PfLaunch);
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes));
    buf_.reset(static_cast<cuda::L2PfLaunch*>(p));
    CUDA_CHECK(cudaMemset(p, 0, bytes));
  }
  void end() {
    if (!recording_) return;
    recording_ = false;
    int64_t v = 0;
    for (cuda::L2PfLaunch& d : plan_) {
      d.vstart = v;
      d.dist = dist_;
      v += d.vlen;
    }
    if (!plan_.empty())
      CUDA_CHECK(cudaMemcpy(buf_.get(), plan_.data(), plan_.size() * sizeof(cuda::L2PfLaunch), cudaMemcpyHostToDevice));
    tables_.push_back(std::move(buf_));
  }
  // This launch's descriptor in the table being recorded, or null (not capturing, off, full).
  const cuda::L2PfLaunch* add(const cuda::L2PfLaunch& d) {
    if (!recording_ || int64_t(plan_.size()) >= kCap || d.vlen <= 0) return nullptr;
    plan_.push_back(d);
    return buf_.get() + (plan_.size() - 1);
  }

  // The descriptor of an in-order 4-bit GEMV launch: one group per segment (its tiles and
  // absmax), or for SwiGLU one group of gate and up consumed together.
  static cuda::L2PfLaunch q4_desc(const cuda::GemvQ4MultiArgs& a) {
    cuda::L2PfLaunch d;
    const bool swiglu = a.ep == cuda::GemvEpilogue::SwiGLU;
    for (int s = 0; s < a.nseg; ++s) {
      const cuda::Q4Device& w = *a.w[s];
      cuda::L2PfGroup& g = d.g[swiglu ? 0 : s];
      add_range(g, w.tiles, w.RT * w.KT * 512);
      if (w.double_quant) add_range(g, w.absq_tiled, w.RT * w.KT * 16);
      else add_range(g, w.absmax_tiled, w.RT * w.KT * 64);
    }
    d.ng = swiglu ? 1 : a.nseg;
    for (int i = 0; i < d.ng; ++i) d.vlen += d.g[i].vlen;
    return d;
  }
  // A dense weight of `bytes` bytes read front to back.
  static cuda::L2PfLaunch dense_desc(const void* w, int64_t bytes) {
    cuda::L2PfLaunch d;
    add_range(d.g[0], w, bytes);
    d.ng = 1;
    d.vlen = d.g[0].vlen;
    return d;
  }

 private:
  static void add_range(cuda::L2PfGroup& g, const void* p, int64_t len) {
    g.r[g.nr].ptr = static_cast<const uint8_t*>(p);
    g.r[g.nr].len = len & ~int64_t(15);
    g.vlen += g.r[g.nr].len;
    ++g.nr;
  }

  int64_t dist_ = 0;
  bool recording_ = false;
  std::vector<cuda::L2PfLaunch> plan_;
  struct Free {
    void operator()(cuda::L2PfLaunch* p) const { cudaFree(p); }
  };
  std::unique_ptr<cuda::L2PfLaunch, Free> buf_;  // the table of the capture in progress
  std::vector<std::unique_ptr<cuda::L2PfLaunch, Free>> tables_;
};

}  // namespace nf4flash::cuda_impl
