// Rotary embedding frequencies exactly as transformers computes them (float32), with the
// llama3 and linear scalings applied; longrope: the short-factor table here, the long one from
// rope_inv_freq_long.
#pragma once
#include <vector>

#include "io/hf_config.h"

namespace nf4flash {

std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim);
// longrope's table for forwards whose last position is past original_max_positions.
std::vector<float> rope_inv_freq_long(const RopeConfig& rope, int head_dim);
// dynamic NTK's table for a forward reaching seq_len > dynamic_max_positions.
std::vector<float> rope_inv_freq_dynamic(const RopeConfig& rope, int head_dim, int64_t seq_len);

}  // namespace nf4flash
