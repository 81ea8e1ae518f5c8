// config.json / generation_config.json readers. Both spellings are understood: the hub's
// (`rope_theta`, `rope_scaling`, `torch_dtype`) and transformers 5's (`rope_parameters`, `dtype`).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace nf4flash {

struct RopeConfig {
  std::string type = "default";  // default | llama3 | linear | longrope
  double theta = 10000.0;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_positions = 0;
  // longrope: per-frequency divisors (head_dim / 2 each), the long ones for a forward whose last
  // position is past original_max_positions; cos and sin scaled by attention_factor
  std::vector<double> short_factor, long_factor;
  double attention_factor = 1.0;  // longrope, yarn: cos and sin scaled by it
  // yarn: the ramp between interpolated and extrapolated frequencies
  double beta_fast = 32.0, beta_slow = 1.0;
  bool truncate = true;
  // dynamic: a forward reaching L > max_positions uses base * (factor L / max - (factor - 1))^(d/(d-2))
  int64_t dynamic_max_positions = 0;
};

// Mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE); n_experts 0: dense.
struct MoeConfig {
  int n_experts = 0, top_k = 0;
  int64_t expert_intermediate = 0;   // each expert's SwiGLU width
  int64_t shared_intermediate = 0;   // Qwen2-MoE's shared expert (0: none)
  bool norm_topk = false;            // the top-k routing weights renormalized to sum to 1
  int sparse_step = 1;               // layer i is sparse when (i + 1) % sparse_step == 0 ...
  std::vector<int> dense_layers;     // ... and i is not listed here (mlp_only_layers)
  bool sparse(int layer) const;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0;
  int n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t max_positions = 0;
  double rms_eps = 1e-6;
  bool tie_embeddings = false;
  bool attention_bias = false;  // q/k/v (and for Llama also o) bias as the config says
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  int64_t sliding_window = 0;   // attention span of each position (0: the whole context)
  std::vector<bool> sliding_layers;  // layers with the sliding window (all, without layer_types)
  MoeConfig moe;
  // Gemma 2/3: attention scale query_pre_attn_scalar^-0.5 (0: head_dim^-0.5), soft-capping of
  // the attention scores and of the logits (0: none), the sliding layers' RoPE (Gemma 3)
  double query_pre_attn_scalar = 0, attn_softcap = 0, final_softcap = 0;
  bool has_local_rope = false;
  RopeConfig local_rope;
  RopeConfig rope;
  DType weights_dtype = DType::BF16;
  nlohmann::json quantization_config;  // null when absent
  std::vector<int32_t> eos_ids;        // from config.json, replaced by generation_config.json's
  int32_t bos_id = -1;
  std::string source;  // path of config.json (for messages)
};

struct GenerationConfig {
  std::vector<int32_t> eos_ids;
  int32_t bos_id = -1;
  bool do_sample = false;
  float temperature = 1.0f, top_p = 1.0f, repetition_penalty = 1.0f;
  int top_k = 50;
  bool present = false;
};

ModelConfig load_model_config(const std::string& model_dir);
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source);
GenerationConfig load_generation_config(const std::string& model_dir);  // absent file: defaults

}  // namespace nf4flash
