// `nf4flash bench --batch 1,8,32,64`: the batched engine (BatchRunner) under load. Per batch size B:
// B requests of -p random prompt tokens (distinct: no prefix-cache hits) and -n greedy new tokens
// (EOS ignored) submitted at once, run to the end with continuous batching. Measured per B:
//   - aggregate decode tok/s: tokens of the steps where every row is a decode, over those steps'
//     time (prefill chunks excluded, as llama-batched-bench's S_TG);
//   - per-sequence decode tok/s: each request's tokens after its first over the time from its first
//     to its last token (median over requests);
//   - TTFT under load: submission to each request's first token (median and max);
//   - end-to-end tok/s (all generated tokens over the wall time), steps, KV blocks used at the peak
//     and the pool's blocks, block size and the tokens the pool holds.
// JSON (schema "nf4flash-bench-batch/1"), Markdown and an SVG chart (aggregate tok/s and TTFT per B).
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_report.h"
#include "nf4flash/engine.h"

namespace nf4flash {

struct BatchBenchSpec {
  std::vector<int> batches{1, 8, 32, 64};
  int64_t prompt = 512;
  int n_gen = 128;
  int block_size = 16;
  int64_t max_tokens_per_step = 2048;
  int warmup = 1;  // unrecorded runs of the largest batch with a few tokens before the first size
  uint64_t seed = 1;
};

struct BatchBenchCell {
  int batch = 0;
  std::string error;
  double wall_s = 0;
  double agg_decode_tok_s = 0, per_seq_decode_tok_s = 0, e2e_tok_s = 0;
  double ttft_ms_median = 0, ttft_ms_max = 0;
  int64_t decode_steps = 0, steps = 0, generated = 0;
  double decode_step_ms = 0;  // mean time of a decode-only step
  int64_t kv_blocks_peak = 0, kv_blocks_total = 0, kv_tokens_total = 0;
};

struct BatchBenchResult {
  BatchBenchSpec spec;
  std::string model;  // preset name or folder
  EngineReport report;
  std::vector<BatchBenchCell> cells;
};

using BatchBenchProgress = std::function<void(const std::string& stage)>;
BatchBenchResult run_batch_bench(Engine& e, const BatchBenchSpec& spec, const std::string& model,
                                 const BatchBenchProgress& progress = nullptr);

nlohmann::json batch_bench_to_json(const BatchBenchResult& r, const BenchMeta& meta);
std::string batch_bench_markdown(const BatchBenchResult& r, const BenchMeta* meta = nullptr);
std::string batch_bench_svg(const BatchBenchResult& r, const std::string& title);

}  // namespace nf4flash
