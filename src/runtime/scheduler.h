// Continuous-batching policy: which sequences run in the next step and how many tokens each.
// Sequences join and leave between steps; a long prompt is prefilled in chunks that share steps
// with the running decodes. The scheduler knows no model and no backend: it counts tokens, and asks
// the paged KV cache about blocks through KvAdmission (the engine adapts KvBlockPool to it).
//
// A sequence's life: submit → Waiting → (admitted) Prefilling → Decoding → Done → finish().
//   positions:  `computed` KV positions are written; the sequence's known tokens are its prompt (P)
//               and the tokens generated so far (g). Prefill computes positions [computed, P + g);
//               the step that reaches P + g samples a token (g += 1). Decoding is the steady state
//               computed == P + g - 1: one position per step, one token per step.
//   Done:       g reached max_new_tokens; it is never scheduled again and waits for finish().
//   finish():   the engine ends a sequence (eos, stop, length, abort) and releases its KV blocks.
//
// One step (the engine's loop):
//   StepPlan p = s.plan_step();
//   release the KV blocks of every p.preempted id (they restart later from position 0),
//   reserve p.seqs[i].n_tokens positions for each entry (KvAdmission said they are available),
//   run the step, sample where entry.samples;
//   for each sampled eos/stop token: s.finish(id, Eos/Stop);
//   for id in s.commit(p): s.finish(id, Length)   (ids that reached max_new_tokens).
//
// Policy of plan_step (deterministic: the same calls give the same plans):
//   1. every Decoding sequence gets 1 token, oldest admitted first;
//   2. the token budget left goes to Prefilling sequences, oldest admitted first, each a chunk as
//      large as the budget left (capped by max_prefill_chunk when set) and the free blocks allow;
//   3. then Waiting sequences in FCFS order (preempted ones first, at the head), while there is a
//      sequence slot (at most max_seqs_per_step sequences hold a slot: Prefilling, Decoding, Done),
//      budget left and the free blocks hold the whole first chunk. The head blocks those behind it
//      (no overtaking). Exception: when the step would otherwise be empty, the head's chunk shrinks
//      to what the free blocks hold, so that no step is empty while a block is free.
//   Blocks: free = kv.available_blocks() − blocks this plan reserved + blocks its preemptions free.
//   Preemption: a Decoding sequence that cannot get the block for its token (and a Prefilling one
//   that cannot get a block for a single token) preempts the most recently admitted sequence that is
//   not yet in this plan (not Done), repeatedly; a Decoding sequence with no such victim preempts
//   itself. A preempted sequence loses its KV blocks and goes back to the head of the waiting queue,
//   to be recomputed (prompt + tokens generated so far) when it is admitted again; it is not
//   re-admitted in the step that preempted it. Why the youngest: it has the least computed work to
//   lose, the order is FCFS-fair, and the oldest sequence is never preempted by a younger one, so
//   it always progresses (no livelock: every accepted request fits the pool alone). Why recompute
//   and not swap: there is no host swap space, and a re-prefill runs at prefill throughput (its full
//   blocks may still be in the prefix cache).
#pragma once
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace nf4flash {

// What the scheduler needs from the paged KV cache. Sequences are named by the request id; a
// sequence the cache holds nothing for has an empty table (a prefix attached before submit counts
// as held). Answers are taken as exact: the engine's reserve of a plan must then succeed.
struct KvAdmission {
  virtual ~KvAdmission();
  // Blocks seq_id's table needs to hold n_more more positions (0 when its last block has room).
  virtual int64_t blocks_needed(int64_t seq_id, int64_t n_more) const = 0;
  // Blocks that would become available if seq_id's table were released now (those no one else
  // holds; a block left only in the prefix cache counts, as it is evictable).
  virtual int64_t releasable_blocks(int64_t seq_id) const = 0;
  virtual int64_t available_blocks() const = 0;  // free + evictable
  virtual int64_t total_blocks() const = 0;
  virtual int block_size() const = 0;
};

struct SchedulerConfig {
  int64_t max_seqs_per_step = 64;     // sequences holding a slot (and so in one step), >= 1
  int64_t max_tokens_per_step = 2048; // tokens of one step, >= max_seqs_per_step
  int64_t max_prefill_chunk = 0;      // tokens of one prefill chunk; 0 = the budget left
  int64_t max_context = 4096;         // prompt + max_new_tokens of one sequence, >= 1
};
// Throws Error naming the first invalid field.
void validate(const SchedulerConfig& c);

struct SchedRequest {
  int64_t id = 0;              // unique among the scheduler's live sequences
  int64_t prompt_len = 0;      // tokens, >= 1
  int64_t cached_len = 0;      // prompt tokens already in the KV cache (attached prefix), < prompt_len
  int64_t max_new_tokens = 0;  // >= 0
};

struct SubmitResult {
  enum class Status { Accepted, Finished, Rejected };
  // Finished: max_new_tokens 0 — done at once with no token and no prefill (an OpenAI-style server
  // answers completion_tokens 0, finish_reason "length"); the scheduler keeps nothing of it.
  // Rejected: `error` is one line naming the request id and the sizes at fault.
  Status status = Status::Accepted;
  std::string error;
  bool ok() const { return status != Status::Rejected; }
};

enum class SeqState { Waiting, Prefilling, Decoding, Done };
enum class FinishReason { Eos, Stop, Length, Abort };
const char* to_string(SeqState s);
const char* to_string(FinishReason r);

struct StepEntry {
  int64_t seq_id = 0;
  int64_t pos0 = 0;      // first position computed (= the sequence's `computed` before the step)
  int64_t n_tokens = 0;  // positions [pos0, pos0 + n_tokens); 1 for a decode
  bool decode = false;   // a Decoding sequence's one token (else a prefill chunk)
  bool samples = false;  // the step ends at the last known token: sample the next one
};

struct StepPlan {
  std::vector<StepEntry> seqs;      // decodes first, then prefill chunks
  std::vector<int64_t> preempted;   // release these sequences' KV blocks before reserving
  int64_t n_tokens = 0;             // sum of seqs[i].n_tokens
  int64_t step = 0;                 // 0, 1, ... in plan_step order
  bool empty() const { return seqs.empty(); }
};

// A sequence as the scheduler sees it (for the engine's reports and for tests).
struct SeqInfo {
  int64_t id = 0, prompt_len = 0, max_new_tokens = 0;
  int64_t computed = 0;   // KV positions written
  int64_t generated = 0;  // tokens sampled
  SeqState state = SeqState::Waiting;
  int64_t preemptions = 0;
};

struct SchedulerStats {
  int64_t submitted = 0, rejected = 0, finished = 0, preemptions = 0, steps = 0;
};

class Scheduler {
 public:
  // Throws Error for an invalid config or a KV cache with no block or a block size < 1.
  Scheduler(const SchedulerConfig& cfg, const KvAdmission& kv);

  SubmitResult submit(const SchedRequest& r);
  // What submit(r) would answer now, changing nothing (no statistics either).
  SubmitResult check(const SchedRequest& r) const;
  StepPlan plan_step();
  // Applies a plan once its step ran: advance() for each entry whose sequence is still live
  // (finish() may have ended it since). Returns the ids that became Done (reached max_new_tokens).
  // Commit each plan before the next plan_step: an entry whose sequence moved on since (a plan
  // committed twice, or after a later plan scheduled the sequence again) is an Error.
  std::vector<int64_t> commit(const StepPlan& p);
  // n_tokens more positions of seq_id are computed (Error if not live or more than it had to
  // compute). Returns its state after: Done when it reached max_new_tokens.
  SeqState advance(int64_t seq_id, int64_t n_tokens);
  // Ends a live sequence in any state; false when the id is not live. The engine releases its
  // KV blocks.
  bool finish(int64_t seq_id, FinishReason reason);

  std::optional<SeqInfo> info(int64_t seq_id) const;
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t n_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t n_running() const { return static_cast<int64_t>(running_.size()); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerConfig& config() const { return cfg_; }

 private:
  struct Seq {
    SeqInfo info;
    int64_t planned = -1;   // the step that last scheduled it
  };
  Seq& get(int64_t id);
  int64_t target(const Seq& s) const { return s.info.prompt_len + s.info.generated; }
  // Largest n <= want whose blocks fit in `free` (0 if none).
  int64_t fit_tokens(int64_t id, int64_t want, int64_t free) const;
  // Preempts the most recently admitted running sequence not in the current plan (never `self`
  // unless allow_self); returns false when there is none.
  bool preempt_youngest(int64_t self, bool allow_self, StepPlan& p, int64_t& free);
  void add(StepPlan& p, Seq& s, int64_t n, bool decode, int64_t& free, int64_t blocks);

  SchedulerConfig cfg_;
  const KvAdmission& kv_;
  std::unordered_map<int64_t, Seq> seqs_;  // lookups only; order lives in the two queues
  std::deque<int64_t> waiting_;            // FCFS; preempted sequences at the front
  std::vector<int64_t> running_;           // admission order (oldest first)
  SchedulerStats stats_;
};

}  // namespace nf4flash
