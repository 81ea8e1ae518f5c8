// The counters behind `GET /metrics` (Prometheus text format 0.0.4), updated by the HTTP handlers
// and the engine loop under one mutex:
//   nf4flash_requests_total{endpoint,status}         HTTP requests answered
//   nf4flash_prompt_tokens_total                     prompt tokens of finished sequences
//   nf4flash_prompt_tokens_cached_total              of which served from the prefix cache
//   nf4flash_generation_tokens_total                 tokens generated
//   nf4flash_prefix_cache_hit_ratio                  cached / prompt tokens (gauge)
//   nf4flash_time_to_first_token_seconds             histogram (submission to first token)
//   nf4flash_time_per_output_token_seconds           histogram (between consecutive tokens)
//   nf4flash_sequences_running / _waiting            gauges
//   nf4flash_kv_blocks_used / _free, nf4flash_kv_block_size
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace nf4flash::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // The histogram's lines under `name` (buckets cumulative, +Inf, _sum, _count).
  std::string text(const std::string& name) const;
  int64_t count() const { return count_; }
  // The value under which a fraction q of the observations fall (bucket upper bound; 0 when empty).
  double quantile_bound(double q) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request(const std::string& endpoint, int status);
  void sequence_done(int64_t prompt_tokens, int64_t cached_tokens, int64_t generated);
  void first_token(double seconds);
  void next_token(double seconds);
  void engine_state(int64_t running, int64_t waiting, int64_t blocks_used, int64_t blocks_free, int block_size);
  std::string prometheus() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_ = 0, cached_ = 0, generated_ = 0;
  Histogram ttft_, tpot_;
  int64_t running_ = 0, waiting_ = 0, used_ = 0, free_ = 0;
  int block_size_ = 0;
};

}  // namespace nf4flash::serve
