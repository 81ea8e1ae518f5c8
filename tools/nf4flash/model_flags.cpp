#include "model_flags.h"

#include <cstdio>

#include "core/error.h"
#include "runtime/placement.h"

namespace nf4flash::cli {

void ModelFlags::add(CLI::App& app, bool require_model) {
  auto* m = app.add_option("--model,-m", model, "Hugging Face model folder (config.json, *.safetensors, tokenizer.json)");
  if (require_model) m->required();
  app.add_option("--device", device, "auto | cuda | cpu (auto: CUDA when present)")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}));
  app.add_option("--quant", quant, "4-bit weights: none | nf4 | fp4 (auto: what the checkpoint has)")
      ->check(CLI::IsMember({"auto", "none", "nf4", "fp4"}));
  app.add_flag("--double-quant", double_quant, "quantize the absmax too (bnb_4bit_use_double_quant)");
  app.add_option("--blocksize", blocksize, "4-bit quantization block size (power of two, 32..4096)");
  app.add_flag("--quant-lm-head", quant_lm_head, "also quantize lm_head (off by default, like bitsandbytes)");
  app.add_option("--compute-dtype", compute, "f32 | bf16 | f16 (auto: bf16; f32: the exact reference path)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16"}));
  app.add_option("--attn", attn, "attention: flash | sdpa | eager (auto: flash on CUDA)")
      ->check(CLI::IsMember({"auto", "flash", "sdpa", "eager"}));
  app.add_flag("--no-cache", no_cache, "recompute the whole context every step (transformers use_cache=False)");
  app.add_flag("--no-graphs", no_graphs, "launch the decode step kernel by kernel instead of as a CUDA graph");
  app.add_option("--tf32", tf32, "on | off: TF32 tensor cores for f32 compute")->check(CLI::IsMember({"on", "off"}));
  app.add_option("--ctx-size,-c", ctx_size, "KV cache capacity in tokens (default: model max, capped by free memory)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  app.add_option("--ubatch", ubatch, "prompt tokens per prefill chunk (default: 4096 on CUDA, 512 on CPU)")->check(CLI::Range(int64_t{1}, int64_t{65536}));
  app.add_option("--gpu-layers", gpu_layers,
                 "N | auto | all: the first N layers on the GPU, the rest on the CPU backend (auto: as many as "
                 "--max-vram holds; default: all, or auto with --max-vram)");
  app.add_option("--max-vram", max_vram,
                 "GPU memory the model may take, e.g. 10GiB (default: free memory less 1 GiB); implies --gpu-layers auto");
  app.add_option("--threads,-t", threads, "CPU threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--tp", tp,
                 "tensor parallel over N GPUs of this host: starts N-1 `nf4flash tp-worker` ranks (under torchrun's "
                 "RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT: rank 0 of that group; see docs/serving.md)")
      ->check(CLI::Range(1, 64));
  app.add_flag("--quiet,-q", quiet, "no progress or summary lines on stderr");
}

LoadOptions ModelFlags::to_options() const {
  LoadOptions o;
  o.model_dir = model;
  o.device = device == "cuda" ? DeviceChoice::CUDA : device == "cpu" ? DeviceChoice::CPU : DeviceChoice::Auto;
  o.quant = quant == "none" ? QuantChoice::None : quant == "nf4" ? QuantChoice::NF4 : quant == "fp4" ? QuantChoice::FP4 : QuantChoice::Auto;
  o.double_quant = double_quant;
  o.blocksize = blocksize;
  o.quant_lm_head = quant_lm_head;
  o.compute = compute == "f32" ? ComputeDType::F32 : compute == "bf16" ? ComputeDType::BF16 : compute == "f16" ? ComputeDType::F16 : ComputeDType::Auto;
  o.attn = attn == "flash" ? AttnChoice::Flash : attn == "sdpa" ? AttnChoice::Sdpa : attn == "eager" ? AttnChoice::Eager : AttnChoice::Auto;
  o.use_cache = !no_cache;
  o.graphs = !no_graphs;
  o.tf32 = tf32 == "on";
  o.ctx_size = ctx_size;
  o.ubatch = ubatch;
  o.threads = threads;
  o.tp = tp;
  o.max_vram = max_vram.empty() ? 0 : parse_size("--max-vram", max_vram);
  o.gpu_layers = !gpu_layers.empty() ? parse_gpu_layers(gpu_layers) : o.max_vram > 0 ? kAutoLayers : kAllLayers;
  return o;
}

void SamplingFlags::add(CLI::App& app) {
  app.add_option("--max-new-tokens,-n", max_new_tokens, "tokens to generate")->check(CLI::Range(0, 1 << 24));
  app.add_option("--temperature", temperature, "0 = greedy (do_sample=False)")->check(CLI::Range(0.0f, 100.0f));
  app.add_option("--top-k", top_k, "keep the k most likely tokens (0: off)")->check(CLI::Range(0, 1 << 24));
  app.add_option("--top-p", top_p, "nucleus sampling mass (1: off)")->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--min-p", min_p, "drop tokens below min_p * p(top) (0: off)")->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--repeat-penalty", repeat_penalty, "transformers repetition_penalty (1: off)")->check(CLI::Range(0.01f, 100.0f));
  app.add_option("--seed", seed, "random seed for sampling");
  app.add_flag("--ignore-eos", ignore_eos, "keep generating past the end-of-sequence token");
}

GenerateOptions SamplingFlags::to_options() const {
  GenerateOptions g;
  g.max_new_tokens = max_new_tokens;
  g.sampling.temperature = temperature;
  g.sampling.top_k = top_k;
  g.sampling.top_p = top_p;
  g.sampling.min_p = min_p;
  g.sampling.repeat_penalty = repeat_penalty;
  g.sampling.seed = seed;
  g.ignore_eos = ignore_eos;
  return g;
}

std::string human_bytes(size_t b) {
  char buf[64];
  if (b >= (size_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1 << 30));
  else if (b >= (size_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

std::unique_ptr<Engine> load_engine(const ModelFlags& f) {
  const bool show = !f.quiet;
  auto progress = [show](const std::string& stage, int done, int total) {
    if (!show) return;
    std::fprintf(stderr, "\r%s %d/%d", stage.c_str(), done, total);
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
  auto e = Engine::load(f.to_options(), progress);
  if (show) std::fprintf(stderr, "%s\n", describe_load(*e).c_str());
  return e;
}

std::string describe_load(const Engine& e) {
  const auto& r = e.report();
  char rate[64] = "";
  if (r.checkpoint_bytes > 0 && r.load_ms > 0)
    std::snprintf(rate, sizeof rate, " (%.2f GB/s of %.2f GB safetensors)", r.checkpoint_bytes / (r.load_ms * 1e6),
                  r.checkpoint_bytes / 1e9);
  return cat("loaded ", r.architecture, " on ", r.backend, " in ", static_cast<int>(r.load_ms), " ms", rate,
             r.tp > 1 ? cat(" | tensor parallel over ", r.tp, " ranks (rank 0's shard:)") : std::string(), " | weights ",
             human_bytes(r.weight_bytes), " resident | kv cache ", human_bytes(r.kv_bytes), " (ctx ", r.ctx_size, ")",
             r.tokenizer_ms > 0 ? cat(" | tokenizer ", static_cast<int>(r.tokenizer_ms + 0.5), " ms") : std::string());
}

std::string summary_line(const Engine& e, const Timing& t) {
  const auto& r = e.report();
  char buf[256];
  std::snprintf(buf, sizeof buf, "prefill: %lld tok in %.1f ms (%.1f tok/s) | decode: %lld tok at %.1f tok/s",
                static_cast<long long>(t.prompt_tokens), t.prefill_ms, t.prefill_tok_s(),
                static_cast<long long>(t.decode_tokens), t.decode_tok_s());
  return cat(buf, t.cached_tokens ? cat(" | cached: ", t.cached_tokens, " tok") : std::string(), " | attn=", r.attn, " quant=", r.quant, r.double_quant ? " dq" : "", r.prequantized ? " (checkpoint)" : "",
             " compute=", r.compute_dtype, " device=", r.device, " cache=", r.use_cache ? "on" : "off",
             " graphs=", r.graphs ? "on" : "off", " weights=", human_bytes(r.weight_bytes));
}

}  // namespace nf4flash::cli
