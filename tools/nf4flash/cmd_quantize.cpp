// nf4flash quantize: write a bitsandbytes 4-bit checkpoint (the layout transformers saves with
// load_in_4bit) from a bf16/f16/f32 model folder. See src/io/bnb_writer.h.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "io/bnb_writer.h"
#include "model_flags.h"

namespace nf4flash::cli {
namespace {

struct QuantizeArgs {
  std::string model, out, quant, compute = "bf16", blocksize = "64";
  bool double_quant = false, quant_lm_head = false, force = false, quiet = false;
};

volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_quantize_signal(int sig) { g_signal = sig; }

// SIGINT/SIGTERM during quantization stop at the next tensor and unwind, which removes the
// temporary folder (a SIGKILL leaves DIR.tmp-XXXXXX behind, never a half-written DIR).
struct SignalScope {
  void (*old_int)(int), (*old_term)(int);
  SignalScope() : old_int(std::signal(SIGINT, on_quantize_signal)), old_term(std::signal(SIGTERM, on_quantize_signal)) {}
  ~SignalScope() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
};

int run_quantize(const QuantizeArgs& a, const std::vector<std::string>& extras) {
  if (!extras.empty()) fail("quantize: unknown option or argument '", extras.front(), "' (see nf4flash quantize --help)");
  // Validated here (not by CLI11) so each mistake is one "error: ..." line naming the flag.
  if (a.model.empty()) fail("--model: required (the bf16/f16/f32 model folder)");
  if (a.out.empty()) fail("--out: required (the folder to write)");
  QuantizeCheckpointOptions o;
  o.model_dir = a.model;
  o.out_dir = a.out;
  if (a.quant.empty()) fail("--quant: required (nf4 or fp4)");
  if (a.blocksize.empty()) fail("--blocksize: needs a value (32, 64, 128, ... 4096)");
  if (a.compute.empty()) fail("--compute-dtype: needs a value (bf16, f16 or f32)");
  if (a.quant == "nf4") o.quant = QuantType::NF4;
  else if (a.quant == "fp4") o.quant = QuantType::FP4;
  else fail("--quant: '", a.quant, "' is not nf4 or fp4");
  if (a.compute == "bf16") o.compute_dtype = DType::BF16;
  else if (a.compute == "f16") o.compute_dtype = DType::F16;
  else if (a.compute == "f32") o.compute_dtype = DType::F32;
  else fail("--compute-dtype: '", a.compute, "' is not bf16, f16 or f32");
  o.double_quant = a.double_quant;
  {
    size_t pos = 0;
    long v = 0;
    try {
      v = std::stol(a.blocksize, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos == 0 || pos != a.blocksize.size() || v <= 0 || v > 1 << 20)
      fail("--blocksize: '", a.blocksize, "' is not a number");
    o.blocksize = static_cast<int>(v);
  }
  o.quant_lm_head = a.quant_lm_head;
  o.force = a.force;

  const bool show = !a.quiet;
  SignalScope signals;
  const bool tty = ::isatty(2);
  auto progress = [show, tty](int k, int n, const std::string& name) {
    if (g_signal) fail("quantize: interrupted by signal ", int(g_signal), "; nothing written");
    if (!show) return;
    if (tty) std::fprintf(stderr, "\rquantize tensor %d/%d %-60s", k, n, name.c_str());
    else std::fprintf(stderr, "quantize tensor %d/%d %s\n", k, n, name.c_str());
  };
  const QuantizeCheckpointResult r = quantize_checkpoint(o, progress);
  if (show && tty) std::fprintf(stderr, "\n");
  const double ratio = r.bytes_before ? double(r.bytes_after) / double(r.bytes_before) : 0.0;
  std::printf("wrote %s: %d tensors quantized (%s%s, blocksize %d), %d kept as they are\n", a.out.c_str(),
              r.n_quantized, a.quant.c_str(), a.double_quant ? " + double quant" : "", o.blocksize, r.n_plain);
  std::printf("bytes before %zu (%s), after %zu (%s), %.1f%% of the original; model.safetensors %zu bytes\n",
              r.bytes_before, human_bytes(r.bytes_before).c_str(), r.bytes_after,
              human_bytes(r.bytes_after).c_str(), 100.0 * ratio, r.file_bytes);
  if (!r.copied_files.empty()) {
    std::string files;
    for (const auto& f : r.copied_files) files += (files.empty() ? "" : ", ") + f;
    std::printf("copied %s\n", files.c_str());
  }
  return 0;
}

CommandRun setup_quantize(CLI::App& app) {
  auto a = std::make_shared<QuantizeArgs>();
  // Unknown options are reported by run_quantize as one error line.
  app.allow_extras();
  app.add_option("--model,-m", a->model, "source model folder (bf16/f16/f32 safetensors)")->type_name("DIR")->expected(0, 1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--out,-o", a->out, "destination folder (written via DIR.tmp-XXXXXX, renamed at the end)")->type_name("DIR")->expected(0, 1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--quant", a->quant, "nf4 | fp4 (required)")->type_name("TYPE")->expected(0, 1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--double-quant", a->double_quant, "quantize the absmax too (bnb_4bit_use_double_quant)");
  app.add_option("--blocksize", a->blocksize, "4-bit block size: 32, 64 (default), 128 ... 4096")->type_name("N")->expected(0, 1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--compute-dtype", a->compute, "bnb_4bit_compute_dtype to record: bf16 (default) | f16 | f32")->type_name("DTYPE")->expected(0, 1)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--quant-lm-head", a->quant_lm_head, "quantize lm_head too (untied models only)");
  app.add_flag("--force", a->force, "replace an existing non-empty --out folder");
  app.add_flag("--quiet,-q", a->quiet, "no progress on stderr");
  CLI::App* sub = &app;
  return [a, sub] { return run_quantize(*a, sub->remaining()); };
}

NF4FLASH_COMMAND("quantize",
                 "Write a bitsandbytes 4-bit checkpoint (NF4/FP4, as transformers saves it) from a bf16/f16/f32 model",
                 setup_quantize);

}  // namespace
}  // namespace nf4flash::cli
