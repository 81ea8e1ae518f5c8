// Host sampling (sampling/sampler.h): the kept set of top-k / top-p / min-p / repetition penalty on
// hand-made logits, ties, the draw in ascending id order with one uniform u (the rule the CUDA
// sampler reproduces), and a sweep of u over a fine grid that must reproduce the kept-set
// probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "sampling/sampler.h"

using namespace nf4flash;

namespace {

SamplingParams params(float t, int k = 0, float top_p = 1.f, float min_p = 0.f, float pen = 1.f) {
  SamplingParams p;
  p.temperature = t;
  p.top_k = k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repeat_penalty = pen;
  return p;
}

int32_t pick(const std::vector<float>& l, const SamplingParams& p, float u, const std::vector<int32_t>& h = {}) {
  return sample_with_uniform(l.data(), static_cast<int64_t>(l.size()), p, h, u);
}

std::vector<int32_t> kept(const std::vector<float>& l, const SamplingParams& p, const std::vector<int32_t>& h = {}) {
  SampleCandidates c;
  sample_candidates(l.data(), static_cast<int64_t>(l.size()), p, h.data(), h.size(), c);
  return c.ids;
}

// weights {e^-2, 1, e^-1, e^-3} = {0.135, 1, 0.368, 0.050}; total 1.553; cumulative over
// ascending ids (normalized): 0.087, 0.731, 0.968, 1
const std::vector<float> kL = {1.0f, 3.0f, 2.0f, 0.0f};

TEST(Sampler, DrawWalksAscendingIds) {
  const auto p = params(1.0f);
  EXPECT_EQ(kept(kL, p), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(pick(kL, p, 0.0f), 0);
  EXPECT_EQ(pick(kL, p, 0.05f), 0);
  EXPECT_EQ(pick(kL, p, 0.5f), 1);
  EXPECT_EQ(pick(kL, p, 0.8f), 2);
  EXPECT_EQ(pick(kL, p, 0.99f), 3);
  EXPECT_EQ(pick(kL, p, std::nextafter(1.0f, 0.0f)), 3);
}

TEST(Sampler, TopK) {
  EXPECT_EQ(kept(kL, params(1.0f, 2)), (std::vector<int32_t>{1, 2}));  // cumulative 0.731, 1
  EXPECT_EQ(pick(kL, params(1.0f, 2), 0.05f), 1);
  EXPECT_EQ(pick(kL, params(1.0f, 2), 0.72f), 1);
  EXPECT_EQ(pick(kL, params(1.0f, 2), 0.74f), 2);
  EXPECT_EQ(kept(kL, params(1.0f, 1)), (std::vector<int32_t>{1}));
  EXPECT_EQ(pick(kL, params(1.0f, 1), 0.99f), 1);
  EXPECT_EQ(kept(kL, params(1.0f, 4)), (std::vector<int32_t>{0, 1, 2, 3}));  // k >= vocab: off
  EXPECT_EQ(kept(kL, params(1.0f, 40)), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(Sampler, TopP) {
  // descending probabilities 0.644 (id 1), 0.237 (id 2), 0.087 (id 0), 0.032 (id 3)
  EXPECT_EQ(kept(kL, params(1.0f, 0, 0.6f)), (std::vector<int32_t>{1}));
  EXPECT_EQ(kept(kL, params(1.0f, 0, 0.7f)), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(kept(kL, params(1.0f, 0, 0.9f)), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(kept(kL, params(1.0f, 0, 0.99f)), (std::vector<int32_t>{0, 1, 2, 3}));
  // kept {0, 1, 2}: weights 0.135, 1, 0.368 -> cumulative 0.0900, 0.755, 1
  EXPECT_EQ(pick(kL, params(1.0f, 0, 0.9f), 0.08f), 0);
  EXPECT_EQ(pick(kL, params(1.0f, 0, 0.9f), 0.10f), 1);
  EXPECT_EQ(pick(kL, params(1.0f, 0, 0.9f), 0.76f), 2);
  // top-p after top-k: within the top 2 (0.731, 0.269) 0.7 keeps one
  EXPECT_EQ(kept(kL, params(1.0f, 2, 0.7f)), (std::vector<int32_t>{1}));
  EXPECT_EQ(kept(kL, params(1.0f, 2, 0.75f)), (std::vector<int32_t>{1, 2}));
}

TEST(Sampler, MinP) {
  EXPECT_EQ(kept(kL, params(1.0f, 0, 1.f, 0.1f)), (std::vector<int32_t>{0, 1, 2}));  // 0.135 >= 0.1
  EXPECT_EQ(kept(kL, params(1.0f, 0, 1.f, 0.2f)), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(kept(kL, params(1.0f, 0, 1.f, 0.5f)), (std::vector<int32_t>{1}));
  EXPECT_EQ(kept(kL, params(1.0f, 0, 1.f, 1.0f)), (std::vector<int32_t>{1}));
  EXPECT_EQ(pick(kL, params(1.0f, 0, 1.f, 0.2f), 0.72f), 1);
  EXPECT_EQ(pick(kL, params(1.0f, 0, 1.f, 0.2f), 0.74f), 2);
}

TEST(Sampler, Temperature) {
  // T = 0.5: weights {e^-4, 1, e^-2, e^-6}: cumulative 0.0158, 0.8808, 0.9979, 1
  EXPECT_EQ(pick(kL, params(0.5f), 0.01f), 0);
  EXPECT_EQ(pick(kL, params(0.5f), 0.02f), 1);
  EXPECT_EQ(pick(kL, params(0.5f), 0.97f), 2);
  EXPECT_EQ(pick(kL, params(0.5f), 0.999f), 3);
  // T = 100: almost uniform
  EXPECT_EQ(pick(kL, params(100.f), 0.26f), 1);
  EXPECT_EQ(pick(kL, params(100.f), 0.76f), 3);
}

TEST(Sampler, RepetitionPenaltyEachIdOnceFromTheOriginalLogit) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, -1.0f};
  // greedy: 3 / 2 = 1.5 < 2 -> id 2; the duplicate does not divide twice (0.75 < 1 would pick id 0 next)
  EXPECT_EQ(pick(l, params(0.f, 0, 1.f, 0.f, 2.f), 0.f, {1, 1, 1}), 2);
  EXPECT_EQ(pick(l, params(0.f, 0, 1.f, 0.f, 2.f), 0.f, {1, 2, 1}), 1);  // 1.5 vs 1.0
  EXPECT_EQ(pick(l, params(0.f, 0, 1.f, 0.f, 1.f), 0.f, {1, 2}), 1);     // penalty 1: off
  // negative logits are multiplied: -1 * 2 = -2; out-of-range ids are ignored
  SampleCandidates c;
  const std::vector<int32_t> h = {3, 3, -5, 99};
  sample_candidates(l.data(), 4, params(1.f, 0, 1.f, 0.f, 2.f), h.data(), h.size(), c);
  ASSERT_EQ(c.ids.size(), 4u);
  EXPECT_NEAR(c.w[3], std::exp(-5.0), 1e-7);
  EXPECT_NEAR(c.w[0], std::exp(-2.0), 1e-7);
  // penalty < 1 raises the seen ids
  EXPECT_EQ(pick(l, params(0.f, 0, 1.f, 0.f, 0.25f), 0.f, {0}), 0);  // 1 / 0.25 = 4 > 3
}

TEST(Sampler, TiesGoToTheLowerId) {
  const std::vector<float> l = {0.5f, 1.0f, 1.0f, 1.0f, 1.0f, -0.0f, 0.0f};
  EXPECT_EQ(pick(l, params(0.f), 0.f), 1);  // greedy: first index
  EXPECT_EQ(kept(l, params(1.f, 2)), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(kept(l, params(1.f, 3)), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(pick(l, params(1.f, 2), 0.49f), 1);
  EXPECT_EQ(pick(l, params(1.f, 2), 0.51f), 2);
  // four equal maxima hold 4 / Z; top_p exactly 2 of them: cumulative 2 >= 0.5 * 4 stops there
  const std::vector<float> e = {1.f, 1.f, 1.f, 1.f};
  EXPECT_EQ(kept(e, params(1.f, 0, 0.5f)), (std::vector<int32_t>{0, 1}));
  // -0 and +0 tie: top-6 keeps the lower id (5, the -0)
  EXPECT_EQ(kept(l, params(1.f, 6)), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(Sampler, NanAndInfinities) {
  const std::vector<float> l = {NAN, 2.0f, -INFINITY, 1.0f};
  for (float u : {0.f, 0.3f, 0.9f, 0.999f}) {
    const int32_t id = pick(l, params(1.f), u);
    EXPECT_TRUE(id == 1 || id == 3) << u;
  }
  EXPECT_EQ(kept(l, params(1.f)), (std::vector<int32_t>{1, 3}));
  // all -inf: every token ties with the max
  const std::vector<float> m = {-INFINITY, -INFINITY, -INFINITY};
  EXPECT_EQ(kept(m, params(1.f)), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(pick(m, params(1.f), 0.5f), 1);
}

// Independent reference of the kept set: full sort, normalized softmax (the pre-refactor code).
std::vector<int32_t> reference_kept(std::vector<float> l, const SamplingParams& p, const std::vector<int32_t>& h) {
  apply_repetition_penalty(l.data(), static_cast<int64_t>(l.size()), h, p.repeat_penalty);
  std::vector<std::pair<float, int32_t>> c;
  for (size_t i = 0; i < l.size(); ++i) c.emplace_back(l[i] / p.temperature, static_cast<int32_t>(i));
  std::sort(c.begin(), c.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(p.top_k);
  std::vector<double> q(c.size());
  double sum = 0;
  for (size_t i = 0; i < c.size(); ++i) sum += (q[i] = std::exp(static_cast<double>(c[i].first - c[0].first)));
  for (auto& x : q) x /= sum;
  size_t n = c.size();
  if (p.top_p < 1.f) {
    double cum = 0;
    n = 0;
    while (n < q.size()) {
      cum += q[n++];
      if (cum >= p.top_p) break;
    }
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < n; ++i)
    if (q[i] >= p.min_p * q[0] && q[i] > 0) ids.push_back(c[i].second);
  std::sort(ids.begin(), ids.end());
  return ids;
}

TEST(Sampler, KeptSetMatchesTheNormalizedReference) {
  std::mt19937 rng(123);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<float> l(300 + trial);
    for (auto& x : l) x = nd(rng);
    l[7] = l[8] = l[9];  // exact ties
    const std::vector<int32_t> h = {3, 7, 3, 100, 250};
    for (const auto& p : {params(0.7f, 40, 0.9f, 0.05f, 1.3f), params(1.5f, 0, 0.5f), params(1.f, 5),
                          params(1.f, 0, 1.f, 0.05f), params(0.7f, 1000, 0.9f, 0.f, 1.3f)})
      EXPECT_EQ(kept(l, p, h), reference_kept(l, p, h)) << "trial " << trial;
  }
}

// Sweeping u over a fine grid must hit every kept id with its probability (to grid resolution).
TEST(Sampler, UniformSweepReproducesProbabilities) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.5f);
  std::vector<float> l(200);
  for (auto& x : l) x = nd(rng);
  const std::vector<int32_t> h = {1, 2, 2, 50};
  for (const auto& p : {params(1.f), params(0.8f, 20, 0.95f, 0.02f, 1.2f), params(1.3f, 0, 0.7f)}) {
    SampleCandidates c;
    sample_candidates(l.data(), static_cast<int64_t>(l.size()), p, h.data(), h.size(), c);
    const double total = std::accumulate(c.w.begin(), c.w.end(), 0.0);
    const int N = 200000;
    std::map<int32_t, int> hits;
    for (int i = 0; i < N; ++i) ++hits[draw_with_uniform(c, static_cast<float>((i + 0.5) / N))];
    for (const auto& [id, n] : hits) EXPECT_TRUE(std::binary_search(c.ids.begin(), c.ids.end(), id)) << id;
    for (size_t j = 0; j < c.ids.size(); ++j)
      EXPECT_NEAR(double(hits[c.ids[j]]) / N, c.w[j] / total, 2.0 / N + 1e-6) << "id " << c.ids[j];
  }
}

TEST(Sampler, SeededSamplerUsesOneUniformPerToken) {
  const auto p = [] {
    SamplingParams q = params(0.9f, 40, 0.95f, 0.01f, 1.1f);
    q.seed = 42;
    return q;
  }();
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> l(500);
  Sampler a(p), b(p), u(p);
  std::vector<int32_t> hist = {1, 2, 3};
  for (int step = 0; step < 20; ++step) {
    for (auto& x : l) x = nd(rng);
    std::vector<float> la = l;
    const int32_t ida = a.sample(la.data(), static_cast<int64_t>(l.size()), hist);
    std::vector<float> lb = l;
    const int32_t idb = b.sample(lb.data(), static_cast<int64_t>(l.size()), hist);
    const int32_t idu = sample_with_uniform(l.data(), static_cast<int64_t>(l.size()), p, hist, u.next_uniform());
    EXPECT_EQ(ida, idb);
    EXPECT_EQ(ida, idu) << "step " << step;
    hist.push_back(ida);
  }
  for (int i = 0; i < 1000; ++i) {
    const float x = u.next_uniform();
    EXPECT_TRUE(x >= 0.f && x < 1.f);
  }
}

TEST(Sampler, GreedyIsArgmaxAfterThePenalty) {
  Sampler s(params(0.f, 0, 1.f, 0.f, 2.f));
  std::vector<float> l = {1.0f, 3.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(l.data(), 4, {1}), 2);
  EXPECT_THROW(Sampler(params(1.f, 0, 1.5f)), Error);
  EXPECT_THROW(Sampler(params(1.f, 0, 1.f, 0.f, 0.f)), Error);
}

}  // namespace
