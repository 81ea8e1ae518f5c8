// nf4flash-kernel-bench: prefill linears, Backend::linear at T = 512 and 4096 rows on the Llama-3-8B
// shapes (14336x4096 gate/up, 4096x14336 down, 4096x4096 q/o, 1024x4096 k/v): nf4-dq weights through
// each 4-bit GEMM path, selected by a backend of its own whose CudaTuning::q4_gemm names it (the
// fused wgmma GEMM where the build and GPU have it; dequantize + cuBLAS), and bf16 weights through
// cuBLAS as the reference. Each row says whether its path is the one the default backend takes at
// that T. Weights rotated over copies past 4x the L2; TFLOP/s = 2 * T * rows * cols / time.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/launchers.h"
#include "bench.h"
#include "core/error.h"

namespace nf4flash::kbench {
namespace {

struct Path {
  std::string label;  // "nf4-dq fused", "nf4-dq dequant", "bf16"
  Backend* be;
  std::vector<std::unique_ptr<Weight>> ws;  // the copies of the current shape
};

}  // namespace

void prefill_linears(Context& c) {
  c.report.section("prefill_linear", "prefill linears (Llama-3-8B shapes; 4-bit GEMM paths, bf16 cuBLAS)");
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Path> paths;
  if (cuda::gemm_q4_wgmma_supported()) {
    owned.push_back(c.backend_with([](CudaTuning& t) { t.q4_gemm = Q4GemmMode::Fused; }));
    paths.push_back({"nf4-dq fused", owned.back().get(), {}});
  } else {
    std::printf("prefill nf4-dq fused: skipped (needs a build for sm_90a and a compute capability 9.0 GPU)\n");
  }
  owned.push_back(c.backend_with([](CudaTuning& t) { t.q4_gemm = Q4GemmMode::Dequant; }));
  paths.push_back({"nf4-dq dequant", owned.back().get(), {}});
  paths.push_back({"bf16", &c.be, {}});

  struct Shape {
    int64_t rows, cols;
  };
  for (Shape s : {Shape{14336, 4096}, Shape{4096, 14336}, Shape{4096, 4096}, Shape{1024, 4096}}) {
    const auto q = random_q4(s.rows, s.cols, true, c.rng);
    const int q4_copies = c.copies_for(double(s.rows * s.cols) / 2);
    for (Path& p : paths) {
      p.ws.clear();
      if (p.label == "bf16") {
        const std::vector<uint16_t> bits = bf16_pattern(size_t(s.rows * s.cols), 3);
        for (int k = c.copies_for(2.0 * double(s.rows * s.cols)); k > 0; --k)
          p.ws.push_back(upload_bf16(*p.be, s.rows, s.cols, bits));
      } else {
        for (int k = 0; k < q4_copies; ++k) p.ws.push_back(p.be->upload_quant4(q));
      }
    }
    const auto q_default = c.be.upload_quant4(q);  // for the path the default backend takes
    for (int T : {512, 4096}) {
      auto xb = randn_bf16(c.be, size_t(T * s.cols), c.rng);
      auto yb = c.be.alloc(size_t(T * s.rows) * 2);
      const Act x = xb->as_act(DType::BF16, T, s.cols), y = yb->as_act(DType::BF16, T, s.rows);
      const int reps = std::max(2, std::min(c.reps, T >= 4096 ? 4 : 16));
      // the kernel a path names comes first ("gemm_q4 fused ...", "dequant ...")
      auto kernel_of = [](const std::string& path) { return path.substr(0, path.find(' ')); };
      const std::string default_kernel = kernel_of(c.be.linear_path(*q_default, T));
      for (Path& p : paths) {
        Backend& be = *p.be;
        const auto& ws = p.ws;
        const double sec =
            time_graph(be, [&](int i) { be.linear(x, *ws[size_t(i) % ws.size()], nullptr, y); }, reps, c.trials);
        const std::string path = be.linear_path(*ws[0], T);
        c.report.row(cat("prefill ", p.label, " ", s.rows, "x", s.cols, " T=", T), sec, 0,
                     2.0 * T * double(s.rows) * double(s.cols),
                     {{"rows", s.rows}, {"cols", s.cols}, {"T", T}, {"weights", p.label == "bf16" ? "bf16" : "nf4-dq"},
                      {"path", path}, {"default", p.label == "bf16" || kernel_of(path) == default_kernel},
                      {"copies", ws.size()}});
      }
    }
  }
}

}  // namespace nf4flash::kbench
