#include "model/rope.h"

#include <cmath>

namespace nf4flash {

namespace {
// transformers' longrope: 1.0 / (ext_factors * base ** (arange(0, dim, 2).float() / dim)), float32
std::vector<float> longrope_table(const RopeConfig& rope, int head_dim, const std::vector<double>& ext) {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / (static_cast<float>(ext[size_t(i)]) * static_cast<float>(std::pow(static_cast<float>(rope.theta), e)));
  }
  return inv;
}
}  // namespace

std::vector<float> rope_inv_freq_long(const RopeConfig& rope, int head_dim) {
  return longrope_table(rope, head_dim, rope.long_factor);
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim) {
  if (rope.type == "longrope") return longrope_table(rope, head_dim, rope.short_factor);
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)) in float32
  for (int i = 0; i < half; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / static_cast<float>(std::pow(static_cast<float>(rope.theta), e));
  }
  if (rope.type == "linear") {
    for (auto& f : inv) f = f / static_cast<float>(rope.factor);
  } else if (rope.type == "llama3") {
    const float factor = static_cast<float>(rope.factor);
    const float lo = static_cast<float>(rope.low_freq_factor), hi = static_cast<float>(rope.high_freq_factor);
    const float old_ctx = static_cast<float>(rope.original_max_positions);
    const float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
    const float two_pi = 2.0f * static_cast<float>(M_PI);
    for (auto& f : inv) {
      const float wavelen = two_pi / f;
      float v = wavelen > low_wavelen ? f / factor : f;
      const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
      if (medium) {
        const float smooth = (old_ctx / wavelen - lo) / (hi - lo);
        v = (1.0f - smooth) * v / factor + smooth * v;
      }
      f = v;
    }
  }
  return inv;
}

}  // namespace nf4flash
