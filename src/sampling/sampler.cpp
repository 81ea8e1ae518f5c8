#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
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
  // float(double in [0,1)) can round up to 1.0f; keep u < 1
  const float u = static_cast<float>(std::uniform_real_distribution<double>(0.0, 1.0)(rng_));
  return u < 1.0f ? u : std::nextafter(1.0f, 0.0f);
}

void apply_repetition_penalty(float* logits, int64_t vocab, const int32_t* history, size_t n_history, float penalty) {
  if (penalty == 1.0f) return;
  std::unordered_set<int32_t> seen;
  for (size_t j = 0; j < n_history; ++j) {
    const int32_t id = history[j];
    if (id < 0 || id >= vocab || !seen.insert(id).second) continue;
    float& l = logits[id];
    l = l < 0 ? l * penalty : l / penalty;
  }
}

void apply_repetition_penalty(float* logits, int64_t vocab, const std::vector<int32_t>& history, float penalty) {
  apply_repetition_penalty(logits, vocab, history.data(), history.size(), penalty);
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

void sample_candidates(const float* logits, int64_t vocab, const SamplingParams& p, const int32_t* history,
                       size_t n_history, SampleCandidates& out) {
  NF4FLASH_CHECK(vocab > 0 && vocab <= INT32_MAX, "sample: vocabulary size ", vocab, " out of range");
  out.ids.clear();
  out.w.clear();
  std::vector<float> s(logits, logits + vocab);
  apply_repetition_penalty(s.data(), vocab, history, n_history, p.repeat_penalty);
  if (p.greedy()) {
    out.ids.push_back(argmax(s.data(), vocab));
    out.w.push_back(1.0);
    return;
  }
  float mx = -INFINITY;
  for (auto& v : s) {
    v = v / p.temperature;
    if (std::isnan(v)) v = -INFINITY;
    mx = std::max(mx, v);
  }
  auto weight = [&](float v) { return v == mx ? 1.0 : std::exp(static_cast<double>(v - mx)); };
  // descending s, ties to the lower id
  auto before = [&](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
  std::vector<int32_t> cand(static_cast<size_t>(vocab));
  std::iota(cand.begin(), cand.end(), 0);
  bool sorted = false;  // cand in descending order (else ascending ids)
  if (p.top_k > 0 && p.top_k < vocab) {
    std::partial_sort(cand.begin(), cand.begin() + p.top_k, cand.end(), before);
    cand.resize(static_cast<size_t>(p.top_k));
    sorted = true;
  }
  std::vector<double> w(cand.size());
  for (size_t j = 0; j < cand.size(); ++j) w[j] = weight(s[cand[j]]);
  if (p.top_p < 1.0f) {  // smallest prefix with cumulative weight >= top_p * Z (at least one)
    if (!sorted) {
      std::sort(cand.begin(), cand.end(), before);
      for (size_t j = 0; j < cand.size(); ++j) w[j] = weight(s[cand[j]]);
      sorted = true;
    }
    double z = 0;
    for (double q : w) z += q;
    const double target = static_cast<double>(p.top_p) * z;
    double cum = 0;
    size_t n = 0;
    while (n < cand.size()) {
      cum += w[n++];
      if (cum >= target) break;
    }
    cand.resize(n);
    w.resize(n);
  }
  // min-p (relative to the most likely token, whose weight is 1) and zero weights
  const double min_p = p.min_p;
  size_t m = 0;
  for (size_t j = 0; j < cand.size(); ++j)
    if (w[j] > 0 && w[j] >= min_p) {
      cand[m] = cand[j];
      w[m++] = w[j];
    }
  cand.resize(m);
  if (sorted) std::sort(cand.begin(), cand.end());
  out.ids = std::move(cand);
  out.w.resize(m);
  for (size_t j = 0; j < m; ++j) out.w[j] = weight(s[out.ids[j]]);
}

int32_t draw_with_uniform(const SampleCandidates& c, float u) {
  NF4FLASH_CHECK(!c.ids.empty() && c.ids.size() == c.w.size(), "sample: empty candidate set");
  double total = 0;
  for (double q : c.w) total += q;
  const double r = static_cast<double>(u) * total;
  double cum = 0;
  for (size_t j = 0; j < c.ids.size(); ++j) {
    cum += c.w[j];
    if (r < cum) return c.ids[j];
  }
  return c.ids.back();
}

int32_t sample_with_uniform(const float* logits, int64_t vocab, const SamplingParams& p,
                            const std::vector<int32_t>& history, float u) {
  SampleCandidates c;
  sample_candidates(logits, vocab, p, history.data(), history.size(), c);
  return draw_with_uniform(c, u);
}

int32_t Sampler::sample(float* logits, int64_t vocab, const std::vector<int32_t>& history) {
  if (p_.greedy()) {
    apply_repetition_penalty(logits, vocab, history, p_.repeat_penalty);
    return argmax(logits, vocab);
  }
  const int32_t id = sample_with_uniform(logits, vocab, p_, history, next_uniform());
  apply_repetition_penalty(logits, vocab, history, p_.repeat_penalty);  // documented in-place effect
  return id;
}

}  // namespace nf4flash
