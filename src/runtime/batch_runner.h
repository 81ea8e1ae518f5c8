// Continuous batching over the paged KV cache: requests join and leave between steps, each step
// one Decoder::forward over every scheduled sequence's rows (decodes and prefill chunks together,
// StepState::paged), the prefix cache shared across requests. Scheduler (the policy),
// PoolAdmission over a KvBlockPool (the blocks) and the engine's decoder and backend (the compute);
// sampling per sequence with its own parameters and seed, on the host, as Engine::generate picks
// (sample_with_uniform), so a request's tokens are those it gets alone. Runs on backends with the
// paged cache (the CPU backend today; construction says so by name elsewhere).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "nf4flash/engine.h"
#include "runtime/kv_admission.h"
#include "runtime/scheduler.h"
#include "sampling/sampler.h"

namespace nf4flash {

struct BatchRunnerOptions {
  int block_size = 16;
  int64_t n_blocks = 0;  // 0: the engine's context size in blocks, times max_seqs_per_step
  SchedulerConfig sched;  // max_tokens_per_step is capped by the decoder's rows per forward
  // Called with each sampled token (the stop tokens too); false ends the request with "stop"
  // (stop strings matched on the text). Null: none.
  std::function<bool(int64_t id, int32_t token)> on_token;
};

struct BatchRequest {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  GenerateOptions gen;  // max_new_tokens, sampling (seed), stop_ids (empty: the model's EOS), ignore_eos
};

struct BatchOutput {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // generated ids, the stop token included (as Engine::generate)
  std::string finish_reason;    // "stop" | "length"
  int64_t prompt_tokens = 0, cached_tokens = 0;
};

class BatchRunner {
 public:
  // Throws Error when the engine's backend has no paged cache, naming it.
  BatchRunner(Engine& engine, const BatchRunnerOptions& o);
  ~BatchRunner();

  // Accepted (runs in later steps), Finished (max_new_tokens 0: its output is returned by the next
  // step()) or Rejected with one line naming the request and the sizes.
  SubmitResult submit(BatchRequest r);
  // One step; the requests that finished in it (and those finished at submit).
  std::vector<BatchOutput> step();
  bool has_work() const { return sched_->has_work() || !done_.empty(); }
  const KvBlockPool& pool() const { return *pool_; }
  const Scheduler& scheduler() const { return *sched_; }

 private:
  struct Seq {
    BatchRequest req;
    std::vector<int32_t> tokens;  // prompt + generated
    std::vector<int32_t> stops;
    std::unique_ptr<Sampler> sampler;
    BatchOutput out;
  };
  void end(int64_t id, const char* reason);

  Engine& engine_;
  std::function<bool(int64_t, int32_t)> on_token_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<PoolAdmission> kv_;
  std::unique_ptr<Scheduler> sched_;
  std::map<int64_t, Seq> seqs_;
  std::vector<BatchOutput> done_;
};

}  // namespace nf4flash
