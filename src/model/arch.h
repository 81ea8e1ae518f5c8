// The architecture table: every supported Hugging Face decoder is the one generic decoder with
// a few flags. Unknown architectures are refused by name, never loaded as Llama.
#pragma once
#include <string>
#include <vector>

#include "io/hf_config.h"

namespace nf4flash {

struct ArchFlags {
  std::string name;       // HF class name
  bool q_bias = false, k_bias = false, v_bias = false, o_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;   // per-head RMSNorm on q and k before RoPE (Qwen3)
  bool fused_qkv = false;     // one qkv_proj [q + k + v rows, hidden] (Phi-3)
  bool fused_gate_up = false; // one gate_up_proj [2 * intermediate, hidden], gate rows first (Phi-3)
  // MoE tensor names under model.layers.N.: Mixtral block_sparse_moe.{gate, experts.E.w1/w3/w2},
  // the Qwen MoE models mlp.{gate, experts.E.gate_proj/up_proj/down_proj, shared_expert.*}
  enum class Moe : uint8_t { None, Mixtral, Qwen } moe = Moe::None;
  // Gemma 2/3: (1 + w) norms, a norm after attention and after the MLP too (pre_feedforward /
  // post_feedforward names), embeddings times sqrt(hidden), GeGLU (tanh) MLP
  bool gemma = false;
};

// Resolves the flags for `c.architecture` (and its config switches); throws for unknown ones.
ArchFlags resolve_arch(const ModelConfig& c);
std::vector<std::string> supported_architectures();

}  // namespace nf4flash
