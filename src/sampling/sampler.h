// Host-side token sampling, in transformers' processor order: repetition penalty, then
// temperature, top-k, top-p, min-p, then a draw with one uniform number u in [0,1) from a seeded
// RNG. temperature 0 = greedy (argmax after the penalty; no uniform is consumed).
//
// The draw is defined so that a device sampler can reproduce it from the same logits and the same
// u (kernels/sample_topk.cuh): with s_i = penalized(l_i) / T (NaN -> -inf) and mx = max s,
//   w_i  = s_i == mx ? 1 : exp(double(s_i - mx))      (float subtraction, exp in double)
//   top-k: the k largest s, ties to the lower id; Z = sum of w over them
//   top-p: the smallest prefix in descending (s, then ascending id) order whose cumulative w is
//          >= top_p * Z (at least one); min-p: w_i >= min_p (w of the max is 1)
//   kept = those with w_i > 0; total = sum of kept w in ascending id order; r = u * total;
//   the result is the first kept id, in ascending id order, whose cumulative w exceeds r (if
//   rounding leaves none, the last kept id).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "nf4flash/options.h"

namespace nf4flash {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // logits: vocab floats (modified in place: the penalty is applied). history: ids seen so far
  // (prompt + generated). Non-greedy: sample_with_uniform(..., next_uniform()).
  int32_t sample(float* logits, int64_t vocab, const std::vector<int32_t>& history);
  // The uniform number the next draw uses (for device samplers that take it from the host).
  float next_uniform();

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
};

// The kept set of one draw: ids in ascending order with their unnormalized weights (all > 0; the
// most likely token has weight 1). Greedy: the argmax alone.
struct SampleCandidates {
  std::vector<int32_t> ids;
  std::vector<double> w;
};
void sample_candidates(const float* logits, int64_t vocab, const SamplingParams& p, const int32_t* history,
                       size_t n_history, SampleCandidates& out);
// The draw over a kept set with uniform u (see the header comment).
int32_t draw_with_uniform(const SampleCandidates& c, float u);
// One token from `logits` (not modified) with uniform u; the pure function behind Sampler::sample.
int32_t sample_with_uniform(const float* logits, int64_t vocab, const SamplingParams& p,
                            const std::vector<int32_t>& history, float u);

// In-place repetition penalty as transformers applies it (each distinct id once).
void apply_repetition_penalty(float* logits, int64_t vocab, const std::vector<int32_t>& history, float penalty);
void apply_repetition_penalty(float* logits, int64_t vocab, const int32_t* history, size_t n_history, float penalty);
int32_t argmax(const float* logits, int64_t vocab);
// log-softmax of `logits` at index `target`, computed in double.
double log_softmax_at(const float* logits, int64_t vocab, int32_t target);

}  // namespace nf4flash
