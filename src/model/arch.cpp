#include "model/arch.h"

#include "core/error.h"

namespace nf4flash {

namespace {
struct ArchRow {
  const char* name;
  enum class Bias { None, FromConfig, QkvOnly } bias;
  bool qk_norm;
  bool fused = false;  // qkv_proj and gate_up_proj
  ArchFlags::Moe moe = ArchFlags::Moe::None;
  bool gemma = false;
};
constexpr ArchRow kArchTable[] = {
    {"LlamaForCausalLM", ArchRow::Bias::FromConfig, false},
    {"MistralForCausalLM", ArchRow::Bias::None, false},
    {"Qwen2ForCausalLM", ArchRow::Bias::QkvOnly, false},
    {"Qwen3ForCausalLM", ArchRow::Bias::FromConfig, true},
    {"Phi3ForCausalLM", ArchRow::Bias::None, false, true},
    {"MixtralForCausalLM", ArchRow::Bias::None, false, false, ArchFlags::Moe::Mixtral},
    {"Qwen2MoeForCausalLM", ArchRow::Bias::QkvOnly, false, false, ArchFlags::Moe::Qwen},
    {"Qwen3MoeForCausalLM", ArchRow::Bias::FromConfig, true, false, ArchFlags::Moe::Qwen},
    {"Gemma2ForCausalLM", ArchRow::Bias::FromConfig, false, false, ArchFlags::Moe::None, true},
    {"Gemma3ForCausalLM", ArchRow::Bias::FromConfig, true, false, ArchFlags::Moe::None, true},
};
}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const auto& r : kArchTable) out.emplace_back(r.name);
  return out;
}

ArchFlags resolve_arch(const ModelConfig& c) {
  for (const auto& r : kArchTable) {
    if (c.architecture != r.name) continue;
    ArchFlags f;
    f.name = r.name;
    f.qk_norm = r.qk_norm;
    f.fused_qkv = f.fused_gate_up = r.fused;
    f.moe = r.moe;
    if (f.moe != ArchFlags::Moe::None && c.moe.n_experts <= 0)
      fail(c.source, ": ", r.name, " without num_experts / num_local_experts");
    if (f.moe == ArchFlags::Moe::None && c.moe.n_experts > 0)
      fail(c.source, ": ", r.name, " with experts (num_experts) is not a mixture-of-experts architecture here");
    switch (r.bias) {
      case ArchRow::Bias::None: break;
      case ArchRow::Bias::FromConfig:
        f.q_bias = f.k_bias = f.v_bias = f.o_bias = c.attention_bias;
        break;
      case ArchRow::Bias::QkvOnly: f.q_bias = f.k_bias = f.v_bias = true; break;
    }
    f.mlp_bias = c.mlp_bias;
    f.gemma = r.gemma;
    const char* act = f.gemma ? "gelu_pytorch_tanh" : "silu";
    if (c.hidden_act != act)
      fail(c.source, ": hidden activation '", c.hidden_act, "' is not supported for ", r.name, " (", act, " only)");
    return f;
  }
  std::string list;
  for (const auto& n : supported_architectures()) list += (list.empty() ? "" : ", ") + n;
  fail(c.source, ": architecture '", c.architecture.empty() ? "(none)" : c.architecture,
       "' is not supported (supported: ", list, ")");
}

}  // namespace nf4flash
