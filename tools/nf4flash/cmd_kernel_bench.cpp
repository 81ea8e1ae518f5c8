// `nf4flash kernel-bench`: microbenchmark of the CUDA decode kernels against the copy bandwidth
// measured in the same run (src/backend/cuda/kernel_bench.h). Prints a table; --json FILE writes
// the full report.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "core/error.h"
#ifdef NF4FLASH_HAVE_CUDA
#include "backend/cuda/kernel_bench.h"
#endif

namespace nf4flash::cli {
namespace {

CommandRun setup(CLI::App& app) {
  struct Opts {
    std::string json;
    int reps = 50, trials = 9, device = 0;
    bool attention_only = false;
    bool gemv_only = false;
    bool prefill_linear_only = false;
    bool read_patterns = false, attn_decode = false;
    std::vector<std::string> shapes, variants;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--json", o->json, "write the JSON report to this file");
  app.add_option("--reps", o->reps, "kernels per timed graph replay")->check(CLI::Range(1, 10000));
  app.add_option("--trials", o->trials, "timed replays (median reported)")->check(CLI::Range(1, 1000));
  app.add_flag("--attention-only", o->attention_only, "only the prefill attention kernels (flash, sdpa, eager)");
  app.add_flag("--gemv-only", o->gemv_only, "only the 4-bit GEMV kernels (variants, fused vs unfused)");
  app.add_flag("--prefill-linear-only", o->prefill_linear_only,
               "only the prefill linears (bf16 cuBLAS vs 4-bit dequantize + cuBLAS, chunked)");
  app.add_flag("--read-patterns", o->read_patterns,
               "only the read-order rows: the same bytes read in the decode kernels' block orders");
  app.add_flag("--attn-decode", o->attn_decode,
               "only decode attention, contexts 128..32768 with the cache read from HBM, per kernel and split order");
  app.add_option("--gemv-shape", o->shapes,
                 "only the 4-bit GEMV on these ROWSxCOLS shapes (T=1, nf4-dq and nf4; repeatable), e.g. 4096x14336")
      ->check([](const std::string& v) -> std::string {
        int64_t r = 0, c = 0;
        char x = 0, extra = 0;
        if (std::sscanf(v.c_str(), "%ld%c%ld%c", &r, &x, &c, &extra) != 3 || x != 'x' || r < 16 || c < 64 || c % 64 ||
            r > 262144 || c > 262144)
          return "expected ROWSxCOLS with rows >= 16, cols a multiple of 64 (e.g. 4096x14336), got '" + v + "'";
        return "";
      });
  app.add_option("--gemv-variant", o->variants,
                 "with --gemv-shape: kernel variants to time (seq = the default; seq-<cfg> = NF4FLASH_GEMV_SEQ_CFG "
                 "configuration, e.g. seq-h8u4d3; grouped = the lean kernel on the grouped tile layout; ablate = the "
                 "default kernel's speed-of-light ablations, wrong results, timing only; repeatable)");
  app.add_option("--device-index", o->device, "CUDA device")->check(CLI::NonNegativeNumber);
  return [o]() -> int {
    const int modes = int(o->attention_only) + int(o->gemv_only) + int(o->prefill_linear_only) + int(o->read_patterns) +
                      int(o->attn_decode) + int(!o->shapes.empty());
    if (modes > 1 && !(o->read_patterns && o->attn_decode && modes == 2))
      fail("kernel-bench: choose one of --attention-only, --gemv-only, --prefill-linear-only, --gemv-shape, "
           "--read-patterns / --attn-decode (those two may go together)");
#ifdef NF4FLASH_HAVE_CUDA
    KernelBenchOptions ko;
    ko.reps = o->reps;
    ko.trials = o->trials;
    ko.device = o->device;
    ko.attention_only = o->attention_only;
    ko.gemv_only = o->gemv_only;
    ko.prefill_linear_only = o->prefill_linear_only;
    ko.read_patterns_only = o->read_patterns;
    ko.attn_decode_only = o->attn_decode;
    for (const auto& v : o->shapes) {
      int64_t r = 0, c = 0;
      std::sscanf(v.c_str(), "%ldx%ld", &r, &c);
      ko.gemv_shapes.emplace_back(r, c);
    }
    ko.gemv_variants = o->variants;
    if (!ko.gemv_variants.empty() && ko.gemv_shapes.empty()) fail("--gemv-variant needs --gemv-shape");
    const std::string js = cuda_kernel_bench(ko);
    if (!o->json.empty()) {
      std::ofstream f(o->json);
      if (!f) fail("--json: cannot write ", o->json);
      f << js << "\n";
    }
    return 0;
#else
    fail("kernel-bench: this nf4flash was built without CUDA (reconfigure with -DNF4FLASH_CUDA=ON)");
#endif
  };
}

}  // namespace

NF4FLASH_COMMAND("kernel-bench", "Time the CUDA kernels (4-bit GEMV, lm_head GEMV, decode attention against copy bandwidth; prefill attention in TFLOP/s)", setup);

}  // namespace nf4flash::cli
