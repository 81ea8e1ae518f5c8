// The engine side of `nf4flash serve`: one thread owns a BatchRunner (continuous batching over the
// paged KV cache, prefix cache across requests) and runs steps while there is work; HTTP handler
// threads submit sequences and read their text as it is generated.
//
// A sequence's text is decoded incrementally (StreamDecoder, special tokens skipped); stop strings
// are matched on the text across token boundaries, and text that may still be the start of a stop
// string is held back, so what a stream has sent never has to be taken back. A cancelled handle
// (its client went away) ends the sequence before the next step and frees its blocks.
//
// Admission: at most max_waiting sequences wait for a slot beyond the running ones (a submit past
// that is refused as QueueFull: HTTP 429 with Retry-After); a prompt plus max_tokens past the
// context is refused as TooLong (400) before it is queued; after stop_accepting() submits are
// refused as ShuttingDown (503).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "nf4flash/engine.h"
#include "runtime/batch_runner.h"
#include "serve/serve_metrics.h"

namespace nf4flash::serve {

struct ServeOptions {
  int max_batch = 16;          // sequences in one step
  int block_size = 16;         // KV positions per block
  int64_t step_tokens = 512;   // tokens in one step (prefill chunks share it with decodes)
  int64_t n_blocks = 0;        // 0: BatchRunner's default (sized from memory)
  int max_waiting = 256;       // sequences waiting for a slot before submits are refused
};

// What a sequence produced since the last read.
struct SeqEvent {
  std::string delta;             // new text (may be empty)
  int64_t tokens = 0;            // tokens generated so far
  std::vector<int32_t> ids;                  // the tokens of this event (with logprobs: their log-probabilities)
  std::vector<TokenLogprobs> logprobs;       // when the sequence asked for them, one per id
  bool finished = false;
  std::string finish_reason;     // "stop" | "length" | "abort" (when finished)
  int64_t prompt_tokens = 0, cached_tokens = 0;  // when finished
};

class SeqHandle {
 public:
  // Waits up to `timeout` for events; returns what came (empty on timeout). After the finished
  // event nothing more comes.
  std::vector<SeqEvent> wait(std::chrono::milliseconds timeout);
  // The client went away: the sequence ends before the engine's next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class ServeEngine;
  void push(SeqEvent e);
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SeqEvent> events_;
  std::atomic<bool> cancelled_{false};
};

struct SubmitSpec {
  std::vector<int32_t> prompt;
  GenerateOptions gen;            // max_new_tokens, sampling (seeded), stop ids / ignore_eos
  std::vector<std::string> stop;  // stop strings, matched on the text
  int logprobs = -1;              // BatchRequest::logprobs
};

class ServeEngine {
 public:
  enum class Refusal { None, QueueFull, TooLong, ShuttingDown, Invalid };
  struct Submitted {
    std::shared_ptr<SeqHandle> handle;  // null when refused
    Refusal refusal = Refusal::None;
    std::string error;                  // why, one line
  };

  ServeEngine(Engine& e, const ServeOptions& o, Metrics& metrics);
  ~ServeEngine();  // cancels what is left and joins the loop

  Submitted submit(SubmitSpec s);
  // Refuse new sequences from now on; in-flight ones continue.
  void stop_accepting() { accepting_ = false; }
  // Sequences submitted and not yet finished.
  int64_t in_flight() const { return in_flight_.load(); }
  // Cancels every sequence still running (shutdown after the grace period).
  void cancel_all();
  int64_t context_size() const { return ctx_; }

 private:
  struct Live;
  void loop();
  bool on_token(int64_t id, int32_t t);  // BatchRunner's callback (engine thread)

  Engine& engine_;
  ServeOptions opt_;
  Metrics& metrics_;
  int64_t ctx_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, SubmitSpec>> pending_;
  std::map<int64_t, std::shared_ptr<SeqHandle>> handles_;  // guarded by mu_ (submit side)
  int64_t next_id_ = 1;
  std::atomic<bool> stop_{false}, accepting_{true};
  std::atomic<int64_t> in_flight_{0}, waiting_{0};
  std::unique_ptr<BatchRunner> runner_;
  std::map<int64_t, Live> live_;  // engine thread only
  std::thread thread_;
};

}  // namespace nf4flash::serve
