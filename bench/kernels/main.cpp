// nf4flash-kernel-bench: microbenchmark of the CUDA backend's default kernels on the Llama-3-8B
// shapes, one run: the device-to-device copy reference, the decode linears (4-bit GEMV, bf16 GEMV,
// lm_head), decode attention, the prefill linears (fused 4-bit GEMM, dequantize + cuBLAS, bf16
// cuBLAS), prefill attention (flash, sdpa, eager), a Qwen3-30B-A3B MoE layer's experts, and the
// forms of the decode GEMV and the skinny GEMM. This file: the command line, the device check, the
// order of the sections and the JSON report. How rows are timed: bench.h.
#include <cstdio>
#include <exception>
#include <fstream>
#include <new>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench.h"
#include "core/error.h"

namespace {

struct Options {
  std::string json_path;
  bool attention_only = false, gemv_only = false, moe_only = false, forms_only = false, skinny_only = false;
  int reps = 50, trials = 9, device = 0;
};

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

nlohmann::json tuning_json(const nf4flash::CudaTuning& t) {
  return {{"pdl", t.pdl},
          {"gemv_max_rows", t.gemv_max_rows},
          {"q4_gemm", nf4flash::q4_gemm_mode_name(t.q4_gemm)},
          {"q4_fused_max_rows", t.q4_fused_max_rows},
          {"dequant_chunk_mb", t.dequant_chunk_mb},
          {"flash_kernel", nf4flash::mma_kernel_choice_name(t.flash_kernel)},
          {"fuse_norm", t.fuse_norm},
          {"dense_multi", t.dense_multi}};
}

int run(const Options& o) {
  using namespace nf4flash;
#if !NF4FLASH_KBENCH_SKINNY_FORMS
  NF4FLASH_CHECK(!o.skinny_only, "--skinny-forms: this build does not target sm_90 (CMAKE_CUDA_ARCHITECTURES without 90)");
#endif
  const int n = cuda_device_count();
  NF4FLASH_CHECK(n > 0, "no usable CUDA device (driver missing or no GPU): nf4flash-kernel-bench needs one");
  NF4FLASH_CHECK(o.device < n, "--device ", o.device, ": out of range (", n, n == 1 ? " device)" : " devices)");
  std::ofstream json_out;
  if (!o.json_path.empty()) {  // fail before the run, not after it
    json_out.open(o.json_path);
    NF4FLASH_CHECK(json_out.good(), "--json ", o.json_path, ": cannot open for writing");
  }

  CudaBackendOptions bo;
  bo.device_index = o.device;
  bo.tuning = cuda_tuning_current();  // the engine's tuning (NF4FLASH_* variables applied)
  auto be = make_cuda_backend(bo);
  kbench::Report report;
  kbench::Context c{*be, bo, {}, o.reps, o.trials, std::mt19937_64(1234), report};
  kbench::cuda_check(cudaGetDeviceProperties(&c.prop, o.device), "cudaGetDeviceProperties");
  std::printf("nf4flash-kernel-bench %s: %s (sm_%d%d, %d SMs, L2 %d MiB), reps %d, trials %d\n", NF4FLASH_VERSION,
              c.prop.name, c.prop.major, c.prop.minor, c.prop.multiProcessorCount, c.prop.l2CacheSize >> 20, o.reps,
              o.trials);

  const double copy_gbs = kbench::copy_reference(c);
  const bool all = !o.attention_only && !o.gemv_only && !o.moe_only && !o.forms_only && !o.skinny_only;
  if (all || o.gemv_only) kbench::decode_linears(c);
  if (all || o.attention_only) kbench::decode_attention(c);
  if (all) kbench::prefill_linears(c);
  if (all || o.attention_only) kbench::prefill_attention(c);
  if (all || o.moe_only) kbench::moe_experts(c);
  std::string forms_differ;
  if (all || o.forms_only) forms_differ = kbench::decode_forms(c);
#if NF4FLASH_KBENCH_SKINNY_FORMS
  if (all || o.skinny_only) {
    const std::string d = kbench::skinny_forms(c);
    if (!d.empty()) forms_differ += (forms_differ.empty() ? "" : "; ") + d;
  }
#endif

  if (json_out.is_open()) {
    const nlohmann::json j = {
        {"schema", "nf4flash-kernel-bench/1"},
        {"version", NF4FLASH_VERSION},
        {"gpu", c.prop.name},
        {"compute_capability", cat(c.prop.major, ".", c.prop.minor)},
        {"sms", c.prop.multiProcessorCount},
        {"l2_bytes", c.prop.l2CacheSize},
        {"backend", be->name()},
        {"tuning", tuning_json(*bo.tuning)},
        {"reps", o.reps},
        {"trials", o.trials},
        {"mode", o.attention_only ? "attention-only"
                 : o.gemv_only    ? "gemv-only"
                 : o.moe_only     ? "moe-only"
                 : o.forms_only   ? "decode-forms"
                 : o.skinny_only  ? "skinny-forms"
                                  : "all"},
        {"copy_gb_per_s", copy_gbs},
        {"attention_prefill_flop_convention", "4 * seq^2 / 2 * head_dim * n_heads (causal)"},
        {"kernels", report.rows()}};
    json_out << j.dump(2) << "\n";
    json_out.close();
    NF4FLASH_CHECK(json_out.good(), "--json ", o.json_path, ": write failed");
    std::printf("\nJSON report: %s\n", o.json_path.c_str());
  }
  // after the report is written: a form with other results than the backend's is a failed run
  NF4FLASH_CHECK(forms_differ.empty(), "forms whose output differs from the backend's or their default's: ",
                 forms_differ);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"nf4flash-kernel-bench: times the CUDA backend's default kernels on the Llama-3-8B shapes "
               "(copy reference, decode linears, decode attention, prefill linears, prefill attention; and a "
               "Qwen3-30B-A3B mixture-of-experts layer; the 4-bit decode GEMV's code-decode forms; the skinny 4-bit "
               "GEMM's stage synchronization)"};
  app.add_option("--json", o.json_path, "Write the JSON report to FILE")->type_name("FILE");
  auto* att = app.add_flag("--attention-only", o.attention_only,
                           "Only the copy reference, decode attention and prefill attention");
  auto* gemv = app.add_flag("--gemv-only", o.gemv_only, "Only the copy reference and the decode linears (GEMV)");
  auto* moe = app.add_flag("--moe-only", o.moe_only, "Only the copy reference and the mixture-of-experts layer");
  auto* forms = app.add_flag("--decode-forms", o.forms_only,
                              "Only the copy reference and the 4-bit decode GEMV's code-decode forms (register "
                              "table or shared table; T=1)");
  att->excludes(gemv);
  moe->excludes(att);
  moe->excludes(gemv);
  for (auto* f : {att, gemv, moe}) forms->excludes(f);
  auto* skinny = app.add_flag("--skinny-forms", o.skinny_only,
                              "Only the copy reference and the skinny 4-bit GEMM's stage synchronization (block "
                              "barrier or mbarrier ring; 16 and 32 rows; builds for sm_90, CC 9.0 GPUs)");
  for (auto* f : {att, gemv, moe, forms}) skinny->excludes(f);
  app.add_option("--reps", o.reps, "Launches per timed graph replay (default 50)")
      ->check(CLI::Range(1, 100000))
      ->type_name("N");
  app.add_option("--trials", o.trials, "Timed replays per row; the median is reported (default 9)")
      ->check(CLI::Range(1, 1000))
      ->type_name("N");
  app.add_option("--device", o.device, "CUDA device index (default 0)")->check(CLI::Range(0, 1023))->type_name("N");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "error: %s\n", one_line(e.what()).c_str());
    return 2;
  }
  try {
    return run(o);
  } catch (const nf4flash::Error& e) {
    std::fprintf(stderr, "error: %s\n", one_line(e.what()).c_str());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", one_line(e.what()).c_str());
  }
  return 1;
}
