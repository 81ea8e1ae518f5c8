// Host-side token sampling, in transformers' processor order: repetition penalty, then
// temperature, top-k, top-p, min-p, then a draw from a seeded RNG. temperature 0 = greedy.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "nf4flash/options.h"

namespace nf4flash {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: vocab floats (modified in place). history: ids seen so far (prompt + generated).
  int32_t sample(float* logits, int64_t vocab, const std::vector<int32_t>& history);
  // The uniform number the next draw uses (for device samplers that take it from the host).
  float next_uniform();

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
};

// In-place repetition penalty as transformers applies it (each distinct id once).
void apply_repetition_penalty(float* logits, int64_t vocab, const std::vector<int32_t>& history, float penalty);
int32_t argmax(const float* logits, int64_t vocab);
// log-softmax of `logits` at index `target`, computed in double.
double log_softmax_at(const float* logits, int64_t vocab, int32_t target);

}  // namespace nf4flash
