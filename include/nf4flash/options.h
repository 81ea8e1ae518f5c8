// Public options of the nf4flash engine: loading/placement, sampling, generation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nf4flash {

enum class DeviceChoice : uint8_t { Auto, CPU, CUDA };
enum class QuantChoice : uint8_t { Auto, None, NF4, FP4 };      // Auto: what the checkpoint has
enum class ComputeDType : uint8_t { Auto, F32, BF16, F16 };     // Auto: bf16 (CPU and CUDA)
enum class AttnChoice : uint8_t { Auto, Flash, Sdpa, Eager };

// LoadOptions::gpu_layers: every layer on the GPU, or as many as --max-vram holds.
constexpr int kAllLayers = -1, kAutoLayers = -2;

struct LoadOptions {
  std::string model_dir;
  DeviceChoice device = DeviceChoice::Auto;
  QuantChoice quant = QuantChoice::Auto;
  bool double_quant = false;
  int blocksize = 64;
  bool quant_lm_head = false;
  ComputeDType compute = ComputeDType::Auto;
  AttnChoice attn = AttnChoice::Auto;
  bool use_cache = true;   // false: recompute the whole context every step (transformers use_cache=False)
  bool graphs = true;      // CUDA graphs for the decode step
  bool tf32 = false;
  int64_t ctx_size = 0;    // 0: the model's max positions, capped by free memory
  int threads = 0;         // CPU threads, 0 = all cores
  int64_t ubatch = 0;      // prompt tokens per prefill chunk; 0: auto (see resolve_ubatch in runtime/plan.h)
  // Placement on CUDA: layers [0, gpu_layers) and their KV cache on the GPU, the rest on the CPU
  // backend (kAllLayers: none offloaded; kAutoLayers: as many as max_vram holds; 0: the whole
  // model on the CPU backend). The embeddings, final norm and lm_head stay on the GPU.
  int gpu_layers = kAllLayers;
  size_t max_vram = 0;     // bytes the GPU part may take (weights, KV, workspace); 0: free memory less a margin
  bool load_tokenizer = true;
  // Engine::load_preset: the tokenizer (tokenizer.json, tokenizer_config.json's chat template) of this
  // folder, for serving a synthetic model with a real tokenizer; empty: none.
  std::string tokenizer_dir;
  // Tensor parallel over tp ranks, one process and GPU each (parallel/tp_process.h: this process
  // leads as rank 0; `--tp N` on one host starts the other ranks itself). 1: none.
  int tp = 1;
};

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (transformers do_sample=False)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float repeat_penalty = 1.0f;  // 1: off (transformers repetition_penalty)
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0f; }
};

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // empty: the model's EOS ids from generation_config.json
  bool ignore_eos = false;
  // Keep the KV cache between generate() calls and prefill only the prompt after its longest
  // common prefix with the tokens already cached (multi-turn chat re-sends the conversation).
  bool reuse_cache = true;
};

}  // namespace nf4flash
