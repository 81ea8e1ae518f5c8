// Rotary embedding frequencies exactly as transformers computes them (float32), with the
// llama3 and linear scalings applied.
#pragma once
#include <vector>

#include "io/hf_config.h"

namespace nf4flash {

std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim);

}  // namespace nf4flash
