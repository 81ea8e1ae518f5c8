#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace nf4flash {

void MoeBlock::ensure(int64_t rows, bool device) {
  if (rows <= cap_) return;
  const int64_t H = cfg_.hidden_size, E = cfg_.moe.n_experts, K = cfg_.moe.top_k;
  const int64_t I = cfg_.moe.expert_intermediate, S = cfg_.moe.shared_intermediate;
  const size_t es = dtype_size(be_.act_dtype());
  const size_t R = static_cast<size_t>(rows), RK = R * size_t(K);  // routed rows: K per row
  logits_ = be_.alloc(R * E * 4);
  shared_logit_ = be_.alloc(R * 4);
  // on the device the routed rows live in the backend's scratch: here only the shared expert's
  const size_t routed = device ? 0 : RK;
  if (!device) xs_ = be_.alloc(std::max(RK, R) * H * es);
  g_ = be_.alloc(std::max(routed * I, R * S) * es);
  u_ = be_.alloc(std::max(routed * I, R * S) * es);
  ys_ = be_.alloc(std::max(routed, R) * H * es);
  cap_ = rows;
}

void MoeBlock::expert(const ExpertWeights& e, int64_t inter, Act xs, Act ys) {
  const Act g{g_->data(), be_.act_dtype(), xs.rows, inter}, u{u_->data(), be_.act_dtype(), xs.rows, inter};
  be_.linear_swiglu(xs, *e.gate, nullptr, *e.up, nullptr, g, u);
  be_.linear(u, *e.down, nullptr, ys);
}

void MoeBlock::forward(Act x, const MoeWeights& w, Act out, bool residual) {
  if (w.set) forward_device(x, w, out, residual);
  else forward_host(x, w, out, residual);
}

void MoeBlock::forward_device(Act x, const MoeWeights& w, Act out, bool residual) {
  const int64_t T = x.rows, H = cfg_.hidden_size, E = cfg_.moe.n_experts;
  const int K = int(cfg_.moe.top_k);
  ensure(T, true);
  const size_t need = be_.moe_scratch_bytes(*w.set, T, K);
  if (!scratch_ || scratch_->bytes() < need) scratch_ = be_.alloc(need);
  const Act logits{logits_->data(), DType::F32, T, E};
  be_.linear(x, *w.router, nullptr, logits);
  Act shared{}, shared_logit{};
  if (w.shared.gate) {
    shared = Act{ys_->data(), be_.act_dtype(), T, H};
    shared_logit = Act{shared_logit_->data(), DType::F32, T, 1};
    expert(w.shared, cfg_.moe.shared_intermediate, x, shared);
    be_.linear(x, *w.shared_gate, nullptr, shared_logit);
  }
  be_.moe_experts(x, logits, *w.set, K, cfg_.moe.norm_topk, shared, shared_logit, scratch_->data(), out, residual);
}

void MoeBlock::forward_host(Act x, const MoeWeights& w, Act out, bool residual) {
  NF4FLASH_CHECK(x.dtype == DType::F32 && out.dtype == DType::F32, "moe: f32 activations (the CPU backend) only");
  const int64_t T = x.rows, H = cfg_.hidden_size, E = cfg_.moe.n_experts, K = cfg_.moe.top_k;
  ensure(T, false);
  const Act logits{logits_->data(), DType::F32, T, E};
  be_.linear(x, *w.router, nullptr, logits);
  h_logits_.resize(size_t(T * E));
  h_x_.resize(size_t(T * H));
  h_y_.resize(size_t(T * H));
  h_out_.assign(size_t(T * H), 0.0f);
  be_.download(h_logits_.data(), logits.data, logits.bytes());
  be_.download(h_x_.data(), x.data, x.bytes());

  // routing: softmax in f32, the top K (ties: the lower index), renormalized if asked
  std::vector<std::vector<std::pair<int64_t, float>>> rows_of(static_cast<size_t>(E));  // (row, weight)
  std::vector<int> order(static_cast<size_t>(E));
  std::vector<float> p(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* l = &h_logits_[size_t(t * E)];
    const float mx = *std::max_element(l, l + E);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += (p[size_t(e)] = std::exp(l[e] - mx));
    for (auto& v : p) v /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int a, int b) { return p[size_t(a)] > p[size_t(b)] || (p[size_t(a)] == p[size_t(b)] && a < b); });
    float norm = 1.0f;
    if (cfg_.moe.norm_topk) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += p[size_t(order[size_t(k)])];
      norm = s;
    }
    for (int64_t k = 0; k < K; ++k) {
      const int e = order[size_t(k)];
      rows_of[size_t(e)].push_back({t, p[size_t(e)] / norm});
    }
  }

  // each expert over its rows, gathered into one block per expert (experts in order, K rows per
  // row in all): gate and up of every expert as one group of products, SiLU, down as another;
  // outputs added in expert order
  const int64_t I = cfg_.moe.expert_intermediate;
  std::vector<int64_t> first(static_cast<size_t>(E) + 1, 0);
  for (int64_t e = 0; e < E; ++e) first[size_t(e) + 1] = first[size_t(e)] + int64_t(rows_of[size_t(e)].size());
  const int64_t routed = first[size_t(E)];
  h_y_.resize(size_t(std::max(routed, T) * H));
  for (int64_t e = 0; e < E; ++e)
    for (size_t r = 0; r < rows_of[size_t(e)].size(); ++r)
      std::copy_n(&h_x_[size_t(rows_of[size_t(e)][r].first * H)], H, &h_y_[size_t((first[size_t(e)] + int64_t(r)) * H)]);
  const size_t row_bytes = size_t(H) * 4;
  be_.upload(xs_->data(), h_y_.data(), size_t(routed) * row_bytes);
  auto rows = [&](const std::unique_ptr<Buffer>& b, int64_t r0, int64_t n, int64_t cols) {
    return Act{static_cast<float*>(b->data()) + r0 * cols, DType::F32, n, cols};
  };
  std::vector<Act> xs, us;
  std::vector<Backend::LinearOut> gu, down;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = first[size_t(e) + 1] - first[size_t(e)];
    if (n == 0) continue;
    const ExpertWeights& x = w.experts[size_t(e)];
    const Act xe = rows(xs_, first[size_t(e)], n, H), ue = rows(u_, first[size_t(e)], n, I);
    xs.insert(xs.end(), {xe, xe});
    gu.push_back({x.gate.get(), nullptr, rows(g_, first[size_t(e)], n, I)});
    gu.push_back({x.up.get(), nullptr, ue});
    us.push_back(ue);
    down.push_back({x.down.get(), nullptr, rows(ys_, first[size_t(e)], n, H)});
  }
  be_.linear_group(xs.data(), gu.data(), int(gu.size()));
  be_.silu_mul(rows(g_, 0, routed, I), rows(u_, 0, routed, I), rows(u_, 0, routed, I));
  be_.linear_group(us.data(), down.data(), int(down.size()));
  be_.download(h_y_.data(), ys_->data(), size_t(routed) * row_bytes);
  for (int64_t e = 0; e < E; ++e) {
    for (size_t r = 0; r < rows_of[size_t(e)].size(); ++r) {
      float* o = &h_out_[size_t(rows_of[size_t(e)][r].first * H)];
      const float* y = &h_y_[size_t((first[size_t(e)] + int64_t(r)) * H)];
      const float pw = rows_of[size_t(e)][r].second;
      for (int64_t c = 0; c < H; ++c) o[c] += y[c] * pw;
    }
  }

  if (w.shared.gate) {
    const Act ys{ys_->data(), DType::F32, T, H}, sg{logits_->data(), DType::F32, T, 1};
    const size_t row_bytes = size_t(H) * 4;
    expert(w.shared, cfg_.moe.shared_intermediate, x, ys);
    be_.linear(x, *w.shared_gate, nullptr, sg);
    be_.download(h_y_.data(), ys.data, size_t(T) * row_bytes);
    be_.download(h_logits_.data(), sg.data, size_t(T) * 4);
    for (int64_t t = 0; t < T; ++t) {
      const float gate = 1.0f / (1.0f + std::exp(-h_logits_[size_t(t)]));
      for (int64_t c = 0; c < H; ++c) h_out_[size_t(t * H + c)] += gate * h_y_[size_t(t * H + c)];
    }
  }
  if (residual) {  // f32: out + the block, as add() adds (h_y_ holds at least T rows)
    be_.download(h_y_.data(), out.data, out.bytes());
    for (size_t i = 0; i < h_out_.size(); ++i) h_out_[i] = h_y_[i] + h_out_[i];
  }
  be_.upload(out.data, h_out_.data(), out.bytes());
}

}  // namespace nf4flash
