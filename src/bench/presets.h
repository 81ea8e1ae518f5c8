// Synthetic models: the shapes of well-known checkpoints with random weights generated in memory
// (no download). Values are deterministic per tensor name, never all zeros: linear weights
// uniform with std 0.02 (transformers' initializer_range), norm weights 1 +- 0.1, biases +-0.05.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "io/safetensors.h"

namespace nf4flash {

std::vector<std::string> preset_names();
std::string preset_list();  // "llama3-8b, llama3.2-1b, ..." for help texts
// The config of a preset; throws Error listing the known names for an unknown one.
ModelConfig preset_config(const std::string& name);
// A store that produces each tensor (bf16) on first find() and frees it on release().
std::unique_ptr<WeightStore> make_synthetic_store(const ModelConfig& cfg, const std::string& name);

}  // namespace nf4flash
