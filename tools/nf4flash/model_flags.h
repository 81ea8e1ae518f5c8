// Flags shared by every model-loading subcommand (run, score, chat, bench, doctor, quantize),
// spelled like transformers/bitsandbytes: --quant nf4 --double-quant --compute-dtype bf16 ...
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "nf4flash/engine.h"
#include "nf4flash/options.h"

namespace nf4flash::cli {

struct ModelFlags {
  std::string model, device = "auto", quant = "auto", compute = "auto", attn = "auto", tf32 = "off";
  bool double_quant = false, quant_lm_head = false, no_cache = false, no_graphs = false, quiet = false;
  int blocksize = 64, threads = 0, tp = 1;
  int64_t ctx_size = 0, ubatch = 0;  // ubatch 0: auto (4096 on CUDA, 512 on CPU)
  std::string gpu_layers, max_vram;  // "": all layers on the GPU, or auto when --max-vram is given

  // require_model: --model is mandatory (false for commands that also take --preset).
  void add(CLI::App& app, bool require_model = true);
  LoadOptions to_options() const;
};

struct SamplingFlags {
  int max_new_tokens = 128;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, repeat_penalty = 1.0f;
  int top_k = 0;
  uint64_t seed = 0;
  bool ignore_eos = false;
  void add(CLI::App& app);
  GenerateOptions to_options() const;
};

// Loads the engine with a progress line on stderr (unless quiet).
std::unique_ptr<Engine> load_engine(const ModelFlags& f);
// "prefill: N tok in X ms (Y tok/s) | decode: M tok at Z tok/s | attn=... quant=..." (stderr)
std::string summary_line(const Engine& e, const Timing& t);
std::string describe_load(const Engine& e);
std::string human_bytes(size_t b);

}  // namespace nf4flash::cli
