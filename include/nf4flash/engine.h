// nf4flash public API: load a Hugging Face model folder, generate with a token callback, score.
//
//   nf4flash::LoadOptions o; o.model_dir = "path/to/model"; o.quant = nf4flash::QuantChoice::NF4;
//   auto eng = nf4flash::Engine::load(o);
//   auto r = eng->generate(ids, gen, [](int32_t id) { ...; return true; });
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nf4flash/options.h"

namespace nf4flash {

class Tokenizer;
class ChatTemplate;
struct ModelConfig;

// What actually runs: reported by run/score/bench/doctor.
struct EngineReport {
  std::string model;             // folder or preset name
  std::string architecture;
  std::string device;            // "cpu" | "cuda"
  std::string backend;           // backend description
  std::string compute_dtype;     // "f32" | "bf16" | "f16"
  std::string quant;             // "none" | "nf4" | "fp4"
  bool double_quant = false;
  bool prequantized = false;     // loaded from a bitsandbytes checkpoint
  std::string attn;              // attention path that runs
  std::string linear_decode;     // matmul kernel for 1 row
  std::string linear_prefill;    // matmul kernel for many rows
  bool use_cache = true;
  bool graphs = false;
  bool decode_pipelined = false; // decode steps queued ahead of the host (with the KV cache)
  size_t weight_bytes = 0;       // resident weights
  size_t kv_bytes = 0;
  int n_layers = 0;
  int gpu_layers = 0;            // layers on the GPU (the first ones); n_layers - gpu_layers offloaded
  std::string offload_device;    // "cpu" when layers are offloaded, else ""
  size_t offloaded_bytes = 0;    // of weight_bytes, on the offload device
  size_t kv_offloaded_bytes = 0; // of kv_bytes, on the offload device
  int64_t ctx_size = 0;
  int tp = 1;                    // tensor-parallel ranks (weight_bytes and kv_bytes: rank 0's shard)
  int64_t ubatch = 0;            // prompt rows per prefill chunk
  double load_ms = 0;             // config, weights and backend setup
  size_t checkpoint_bytes = 0;    // tensor bytes in the folder's safetensors files (0: a preset)
  double tokenizer_ms = 0;        // tokenizer.json (+ tokenizer_config.json, chat template); 0: not loaded
};

struct Timing {
  int64_t prompt_tokens = 0;   // prompt tokens run through the model (not counting cached ones)
  int64_t cached_tokens = 0;   // prompt tokens whose K/V were reused from the previous generate()
  double prefill_ms = 0;       // prompt in -> first token's logits ready (TTFT without sampling)
  int64_t decode_tokens = 0;   // generated tokens after the first
  double decode_ms = 0;
  double prefill_tok_s() const { return prefill_ms > 0 ? prompt_tokens * 1000.0 / prefill_ms : 0; }
  double decode_tok_s() const { return decode_ms > 0 ? decode_tokens * 1000.0 / decode_ms : 0; }
};

struct ScoreResult {
  std::vector<float> next_token_logprobs;  // [n-1]: log p(token[t+1] | tokens[..t])
  double perplexity = 0;
  std::vector<float> last_logits;          // [vocab] when asked
  std::vector<std::vector<float>> logits;  // per position, when asked (all rows)
  Timing timing;
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (without the prompt)
  std::string stop_reason;      // "eos" | "length" | "callback"
  Timing timing;
};

using ProgressFn = std::function<void(const std::string& stage, int done, int total)>;
// Called with each generated id as soon as it is known; return false to stop.
using TokenFn = std::function<bool(int32_t id)>;

class Engine {
 public:
  static std::unique_ptr<Engine> load(const LoadOptions& opts, const ProgressFn& progress = nullptr);
  // A synthetic model (random weights, never zeros) of a known shape (bench/presets.h lists them:
  // llama3-8b, llama3.2-1b, qwen2.5-7b, mistral-7b, llama3-70b, tiny; gemma2-9b, phi3-mini, mixtral-8x7b and
  // qwen3-30b-a3b). opts.model_dir is ignored.
  static std::unique_ptr<Engine> load_preset(const std::string& preset, const LoadOptions& opts,
                                             const ProgressFn& progress = nullptr);
  // A synthetic model of any config (a preset's, reshaped), weights made as the presets make them.
  static std::unique_ptr<Engine> load_synthetic(const ModelConfig& cfg, const std::string& name, const LoadOptions& opts);
  ~Engine();

  ScoreResult score(const std::vector<int32_t>& tokens, bool want_last_logits = false, bool want_all_logits = false);
  GenerateResult generate(const std::vector<int32_t>& prompt, const GenerateOptions& g, const TokenFn& on_token = nullptr);

  // Benchmark primitives: prefill `n` synthetic tokens at positions [pos0, pos0+n) and return the
  // time to logits (ms, device-synchronized); decode `n` tokens from position pos0, return ms.
  double bench_prefill(int64_t n, int64_t pos0);
  double bench_decode(int64_t n, int64_t pos0);

  const EngineReport& report() const;
  const ModelConfig& config() const;
  const Tokenizer* tokenizer() const;  // null when the folder has none
  const ChatTemplate* chat_template() const;  // null when tokenizer_config.json has none
  const std::string& chat_template_error() const;  // why it could not be loaded, if it could not
  std::vector<int32_t> eos_ids() const;
  int64_t vocab_size() const;
  int64_t ctx_size() const;

  struct Impl;
  Impl& internals() { return *impl_; }  // for bench/doctor and tests (src/runtime/engine_impl.h)
  // An engine over internals built by build_engine (src/runtime/engine_impl.h).
  static std::unique_ptr<Engine> from_internals(std::unique_ptr<Impl> impl);

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nf4flash
