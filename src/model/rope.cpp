#include "model/rope.h"

#include <algorithm>
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

std::vector<float> rope_inv_freq_dynamic(const RopeConfig& rope, int head_dim, int64_t seq_len) {
  // transformers' _compute_dynamic_ntk_parameters, in float32 as its tensors are
  const float factor = static_cast<float>(rope.factor), maxp = static_cast<float>(rope.dynamic_max_positions);
  const float t = factor * static_cast<float>(seq_len) / maxp - (factor - 1.0f);
  const float base = static_cast<float>(rope.theta) *
                     std::pow(t, static_cast<float>(double(head_dim) / double(head_dim - 2)));
  std::vector<float> inv(size_t(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i)
    inv[size_t(i)] = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return inv;
}

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
  if (rope.type == "yarn") {
    // transformers' _compute_yarn_parameters (float32 tensors; the correction range in double)
    const double dim = head_dim, base = rope.theta, omax = double(rope.original_max_positions);
    auto corr_dim = [&](double rot) { return dim * std::log(omax / (rot * 2 * M_PI)) / (2 * std::log(base)); };
    double lo = corr_dim(rope.beta_fast), hi = corr_dim(rope.beta_slow);
    if (rope.truncate) {
      lo = std::floor(lo);
      hi = std::ceil(hi);
    }
    lo = std::max(lo, 0.0);
    hi = std::min(hi, dim - 1);
    if (lo == hi) hi += 0.001;
    const float factor = static_cast<float>(rope.factor);
    for (int i = 0; i < half; ++i) {
      const float pos_freq = static_cast<float>(std::pow(static_cast<float>(rope.theta),
                                                         static_cast<float>(2 * i) / static_cast<float>(head_dim)));
      const float extrap = 1.0f / pos_freq, interp = 1.0f / (factor * pos_freq);
      const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(lo)) / static_cast<float>(hi - lo), 0.0f, 1.0f);
      const float w = 1.0f - ramp;  // the extrapolation share
      inv[size_t(i)] = interp * (1.0f - w) + extrap * w;
    }
  } else if (rope.type == "linear") {
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
