#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/error.h"

namespace nf4flash {

Sampler::Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {
  if (p.temperature < 0) fail("--temperature must be >= 0 (got ", p.temperature, ")");
  if (p.top_k < 0) fail("--top-k must be >= 0 (got ", p.top_k, ")");
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("--top-p must be in (0, 1] (got ", p.top_p, ")");
  if (!(p.min_p >= 0 && p.min_p <= 1)) fail("--min-p must be in [0, 1] (got ", p.min_p, ")");
  if (!(p.repeat_penalty > 0)) fail("--repeat-penalty must be > 0 (got ", p.repeat_penalty, ")");
}

float Sampler::next_uniform() {
  return static_cast<float>(std::uniform_real_distribution<double>(0.0, 1.0)(rng_));
}

void apply_repetition_penalty(float* logits, int64_t vocab, const std::vector<int32_t>& history, float penalty) {
  if (penalty == 1.0f) return;
  std::unordered_set<int32_t> seen;
  for (int32_t id : history) {
    if (id < 0 || id >= vocab || !seen.insert(id).second) continue;
    float& l = logits[id];
    l = l < 0 ? l * penalty : l / penalty;
  }
}

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

double log_softmax_at(const float* logits, int64_t vocab, int32_t target) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double s = 0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  return static_cast<double>(logits[target]) - mx - std::log(s);
}

int32_t Sampler::sample(float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  apply_repetition_penalty(logits, vocab, history, p_.repeat_penalty);
  if (p_.greedy()) return argmax(logits, vocab);
  // temperature
  cand_.clear();
  cand_.reserve(vocab);
  for (int64_t i = 0; i < vocab; ++i) cand_.emplace_back(logits[i] / p_.temperature, static_cast<int32_t>(i));
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = cand_.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < keep) {
    keep = p_.top_k;
    std::partial_sort(cand_.begin(), cand_.begin() + keep, cand_.end(), by_logit);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // softmax over the survivors
  const float mx = cand_[0].first;
  std::vector<double> prob(cand_.size());
  double sum = 0;
  for (size_t i = 0; i < cand_.size(); ++i) sum += (prob[i] = std::exp(static_cast<double>(cand_[i].first - mx)));
  for (auto& q : prob) q /= sum;
  if (p_.top_p < 1.0f) {  // smallest prefix with cumulative probability >= top_p (at least one)
    double cum = 0;
    size_t n = 0;
    while (n < prob.size()) {
      cum += prob[n++];
      if (cum >= p_.top_p) break;
    }
    prob.resize(n);
  }
  if (p_.min_p > 0.0f) {  // drop tokens below min_p * p(max)
    const double thr = p_.min_p * prob[0];
    size_t n = 1;
    while (n < prob.size() && prob[n] >= thr) ++n;
    prob.resize(n);
  }
  double total = 0;
  for (double q : prob) total += q;
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double cum = 0;
  for (size_t i = 0; i < prob.size(); ++i) {
    cum += prob[i];
    if (r < cum) return cand_[i].second;
  }
  return cand_[prob.size() - 1].second;
}

}  // namespace nf4flash
