// Prometheus text of the serve counters (serve_metrics.h).
#include "serve/serve_metrics.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace nf4flash::serve {

namespace {
std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}
}  // namespace

void Histogram::observe(double v) {
  const size_t i = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  ++counts_[i];
  sum_ += v;
  ++count_;
}

std::string Histogram::text(const std::string& name) const {
  std::ostringstream o;
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    o << name << "_bucket{le=\"" << num(bounds_[i]) << "\"} " << cum << "\n";
  }
  o << name << "_bucket{le=\"+Inf\"} " << count_ << "\n" << name << "_sum " << num(sum_) << "\n"
    << name << "_count " << count_ << "\n";
  return o.str();
}

double Histogram::quantile_bound(double q) const {
  if (count_ == 0) return 0;
  const double want = q * double(count_);
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    if (double(cum) >= want) return bounds_[i];
  }
  return bounds_.empty() ? 0 : bounds_.back();
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5}) {}

void Metrics::request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::sequence_done(int64_t prompt_tokens, int64_t cached_tokens, int64_t generated) {
  std::lock_guard<std::mutex> l(mu_);
  prompt_ += prompt_tokens;
  cached_ += cached_tokens;
  generated_ += generated;
}

void Metrics::first_token(double s) {
  std::lock_guard<std::mutex> l(mu_);
  ttft_.observe(s);
}

void Metrics::next_token(double s) {
  std::lock_guard<std::mutex> l(mu_);
  tpot_.observe(s);
}

void Metrics::engine_state(int64_t running, int64_t waiting, int64_t used, int64_t free, int block_size) {
  std::lock_guard<std::mutex> l(mu_);
  running_ = running;
  waiting_ = waiting;
  used_ = used;
  free_ = free;
  block_size_ = block_size;
}

std::string Metrics::prometheus() const {
  std::lock_guard<std::mutex> l(mu_);
  std::ostringstream o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  head("nf4flash_requests_total", "counter", "HTTP requests answered, by endpoint and status");
  for (const auto& [k, n] : requests_)
    o << "nf4flash_requests_total{endpoint=\"" << k.first << "\",status=\"" << k.second << "\"} " << n << "\n";
  head("nf4flash_prompt_tokens_total", "counter", "Prompt tokens of finished sequences");
  o << "nf4flash_prompt_tokens_total " << prompt_ << "\n";
  head("nf4flash_prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache");
  o << "nf4flash_prompt_tokens_cached_total " << cached_ << "\n";
  head("nf4flash_prefix_cache_hit_ratio", "gauge", "Cached over all prompt tokens of finished sequences");
  o << "nf4flash_prefix_cache_hit_ratio " << num(prompt_ ? double(cached_) / double(prompt_) : 0.0) << "\n";
  head("nf4flash_generation_tokens_total", "counter", "Tokens generated");
  o << "nf4flash_generation_tokens_total " << generated_ << "\n";
  head("nf4flash_time_to_first_token_seconds", "histogram", "Submission to first token");
  o << ttft_.text("nf4flash_time_to_first_token_seconds");
  head("nf4flash_time_per_output_token_seconds", "histogram", "Time between consecutive tokens of a sequence");
  o << tpot_.text("nf4flash_time_per_output_token_seconds");
  head("nf4flash_sequences_running", "gauge", "Sequences holding a batch slot");
  o << "nf4flash_sequences_running " << running_ << "\n";
  head("nf4flash_sequences_waiting", "gauge", "Sequences waiting for a slot");
  o << "nf4flash_sequences_waiting " << waiting_ << "\n";
  head("nf4flash_kv_blocks_used", "gauge", "KV cache blocks held by sequences or the prefix cache");
  o << "nf4flash_kv_blocks_used " << used_ << "\n";
  head("nf4flash_kv_blocks_free", "gauge", "KV cache blocks free or evictable");
  o << "nf4flash_kv_blocks_free " << free_ << "\n";
  head("nf4flash_kv_block_size", "gauge", "Positions per KV cache block");
  o << "nf4flash_kv_block_size " << block_size_ << "\n";
  return o.str();
}

}  // namespace nf4flash::serve
