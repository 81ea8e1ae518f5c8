// kernel-bench rows of the 4-bit decode GEMV on backends made differently from the default one
// (kernel_bench_util.h, GemvAltBench): the grouped tile layout (CudaBackendOptions::q4_tile_group =
// 32: batches of neighbouring row tiles side by side, weights uploaded there) and the default
// kernel's speed-of-light ablations (CudaBackendOptions::gemv_ablate: h8u4d3's T = 1 form less the
// code table, less the absmax path, less all decode work (table, absmax, byte permutes, per-tile x
// loads); wrong results, timed on the caller's weights). x and y are the caller's (the same
// device); each backend is made on first use.
#include <utility>

#include "backend/cuda/kernel_bench_util.h"
#include "core/error.h"

namespace nf4flash::kbench {

GemvAltBench::GemvAltBench(const CudaBackendOptions& bo, int reps, int trials, std::mt19937& g, ReportFn report)
    : bo_(bo), reps_(reps), trials_(trials), g_(g), report_(std::move(report)) {}

Backend& GemvAltBench::backend(int tile_group, int ablate) {
  std::unique_ptr<Backend>& b = backends_[{tile_group, ablate}];
  if (!b) {
    CudaBackendOptions o = bo_;
    o.q4_tile_group = tile_group;
    o.gemv_ablate = ablate;
    b = make_cuda_backend(o);
  }
  return *b;
}

void GemvAltBench::grouped(int64_t R, int64_t K, bool dq, int copies, Act x, Act y, const std::string& name) {
  Backend& bg = backend(32, 0);
  std::vector<std::unique_ptr<Weight>> wg;
  for (int c = 0; c < copies; ++c) wg.push_back(bg.upload_quant4(random_q4(R, K, dq, g_)));
  const double sec = time_graph(bg, [&](int i) { bg.linear(x, *wg[size_t(i % copies)], nullptr, y); }, reps_, trials_);
  report_(name, sec, double(wg[0]->resident_bytes()) + (K + R) * 2.0,
          {{"rows", R}, {"cols", K}, {"T", 1}, {"double_quant", dq}, {"copies", copies}, {"variant", "grouped"},
           {"path", bg.linear_path(*wg[0], 1)}});
}

void GemvAltBench::ablated(const std::vector<std::unique_ptr<Weight>>& ws, int64_t R, int64_t K, Act x, Act y) {
  const int copies = int(ws.size());
  for (auto [mask, tag] : {std::pair{1, "lut"}, std::pair{2, "scale"}, std::pair{7, "bare"}}) {
    Backend& ba = backend(0, mask);
    const double sec =
        time_graph(ba, [&](int i) { ba.linear(x, *ws[size_t(i % copies)], nullptr, y); }, reps_, trials_);
    report_(cat("gemv nf4-dq ", R, "x", K, " T=1 ablate-", tag), sec, double(ws[0]->resident_bytes()) + (K + R) * 2.0,
            {{"rows", R}, {"cols", K}, {"T", 1}, {"double_quant", true}, {"copies", copies}, {"ablate", mask},
             {"path", ba.linear_path(*ws[0], 1)}});
  }
}

}  // namespace nf4flash::kbench
