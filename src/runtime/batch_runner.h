// Continuous batching over the paged KV cache: requests join and leave between steps, each step
// one Decoder::forward over every scheduled sequence's rows (decodes and prefill chunks together,
// StepState::paged), the prefix cache shared across requests. Scheduler (the policy),
// PoolAdmission over a KvBlockPool (the blocks) and the engine's decoder and backend (the compute);
// sampling per sequence with its own parameters and seed, as Engine::generate picks (the backend's
// sample_rows, else sample_with_uniform on the host), so a request's tokens are those it gets
// alone. Runs on backends with the paged cache (CPU and CUDA).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/block_pool.h"
#include "nf4flash/engine.h"
#include "parallel/tp_step.h"
#include "runtime/kv_admission.h"
#include "runtime/scheduler.h"
#include "sampling/sampler.h"

namespace nf4flash {

struct BatchRunnerOptions {
  int block_size = 16;
  // 0: the engine's context size in blocks times max_seqs_per_step, capped by the device memory left
  int64_t n_blocks = 0;
  SchedulerConfig sched;  // max_tokens_per_step is capped by the decoder's rows per forward
  // Called with each sampled token (the stop tokens too); false ends the request with "stop"
  // (stop strings matched on the text). Null: none.
  std::function<bool(int64_t id, int32_t token)> on_token;
};

struct BatchRequest {
  int64_t id = 0;
  std::vector<int32_t> prompt;
  GenerateOptions gen;  // max_new_tokens, sampling (seed), stop_ids (empty: the model's EOS), ignore_eos
  // >= 0: each generated token's log-probability and the `logprobs` most likely tokens', from the
  // model's distribution (log-softmax of the raw logits); -1: none
  int logprobs = -1;
};

// A generated token's log-probability and the most likely tokens' (best first).
struct TokenLogprobs {
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};
// Log-softmax of logits [vocab] at `token`, and the top_n most likely (ties: lower id first).
TokenLogprobs token_logprobs(const float* logits, int64_t vocab, int32_t token, int top_n);

struct BatchOutput {
  int64_t id = 0;
  std::vector<int32_t> tokens;  // generated ids, the stop token included (as Engine::generate)
  std::string finish_reason;    // "stop" | "length" | "abort"
  int64_t prompt_tokens = 0, cached_tokens = 0;
};

class BatchRunner {
 public:
  // Throws Error when the engine's backend has no paged cache, naming it.
  BatchRunner(Engine& engine, const BatchRunnerOptions& o);
  ~BatchRunner();

  // Accepted (runs in later steps), Finished (max_new_tokens 0: its output is returned by the next
  // step()) or Rejected with one line naming the request and the sizes.
  // A prompt that shares full KV blocks with a running request which has not computed them yet
  // (n samples of one prompt, requests with one system prompt submitted together) waits for
  // them: it enters the scheduler once that request's prefill has passed them (or it ended), and
  // takes them from the prefix cache instead of computing them again.
  SubmitResult submit(BatchRequest r);
  // One step; the requests that finished in it (and those finished at submit or cancelled).
  std::vector<BatchOutput> step();
  // Ends a running request now (its client went away): its blocks are freed and the next step()
  // returns it with finish_reason "abort". False when the id is not running.
  bool cancel(int64_t id);
  bool has_work() const { return sched_->has_work() || !done_.empty() || !deferred_.empty(); }
  // What the last step() computed: its sequences, rows, sampled tokens, and whether every row was
  // a decode (one row per sequence, each sampling).
  struct StepInfo {
    int seqs = 0;
    int64_t rows = 0, sampled = 0;
    bool decode_only = false;
  };
  const StepInfo& last_step() const { return last_; }
  const KvBlockPool& pool() const { return *pool_; }
  // Decode-only step shapes replayed as captured graphs so far (0 where the backend has none or
  // graphs are off).
  size_t step_graphs() const;
  const Scheduler& scheduler() const { return *sched_; }
  // During on_token: the log-probabilities of the token just sampled for `id`, when its request
  // asked for them (else null).
  const TokenLogprobs* step_logprobs(int64_t id) const {
    auto it = step_lp_.find(id);
    return it == step_lp_.end() ? nullptr : &it->second;
  }

 private:
  struct Seq {
    BatchRequest req;
    std::vector<int32_t> tokens;  // prompt + generated
    std::vector<int32_t> stops;
    std::unique_ptr<Sampler> sampler;
    BatchOutput out;
    int64_t wait_for = -1;  // deferred: the request whose prefill computes its shared blocks
    int64_t share = 0;      // ... the positions of those blocks
  };
  void end(int64_t id, const char* reason);
  // The live, not deferred request with the most full blocks of `prompt` still to compute (-1:
  // none, or another live request has computed at least as many); share: their positions.
  int64_t prefill_sibling(const std::vector<int32_t>& prompt, int64_t& share) const;
  // Submits the request to the KV cache and the scheduler (its cached prefix attached).
  SubmitResult enter(Seq& q);
  // Enters the deferred requests whose sibling has computed their blocks or ended.
  void release_deferred();

  Engine& engine_;
  std::function<bool(int64_t, int32_t)> on_token_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<PoolAdmission> kv_;
  std::unique_ptr<Scheduler> sched_;
  std::map<int64_t, Seq> seqs_;
  std::vector<int64_t> deferred_;  // requests waiting for a sibling's prefill, in submit order
  std::vector<BatchOutput> done_;
  StepInfo last_;
  std::map<int64_t, TokenLogprobs> step_lp_;  // this step's, for the requests that ask
  // a step's forward on this process's decoder (its inputs' buffers reused from step to step;
  // under tensor parallel rank 0's TpLeader runs it instead), and the step's logits
  std::unique_ptr<TpStepRunner> runner_;
  std::unique_ptr<Buffer> buf_logits_;
};

}  // namespace nf4flash
