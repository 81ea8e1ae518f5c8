// Continuous-batching policy (see scheduler.h for the life of a sequence and the step policy).
// Admission and preemption are the only places that move sequences between the waiting queue and
// the running list; advance() moves positions; finish() forgets a sequence.
#include "runtime/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace nf4flash {

KvAdmission::~KvAdmission() = default;

void validate(const SchedulerConfig& c) {
  NF4FLASH_CHECK(c.max_seqs_per_step >= 1, "scheduler: max_seqs_per_step must be >= 1 (got ",
                 c.max_seqs_per_step, ")");
  NF4FLASH_CHECK(c.max_tokens_per_step >= c.max_seqs_per_step,
                 "scheduler: max_tokens_per_step (", c.max_tokens_per_step,
                 ") must be >= max_seqs_per_step (", c.max_seqs_per_step,
                 "): every running sequence needs a token per step");
  NF4FLASH_CHECK(c.max_prefill_chunk >= 0, "scheduler: max_prefill_chunk must be >= 0 (0 = the budget left; got ",
                 c.max_prefill_chunk, ")");
  NF4FLASH_CHECK(c.max_context >= 1, "scheduler: max_context must be >= 1 (got ", c.max_context, ")");
}

const char* to_string(SeqState s) {
  switch (s) {
    case SeqState::Waiting: return "waiting";
    case SeqState::Prefilling: return "prefilling";
    case SeqState::Decoding: return "decoding";
    case SeqState::Done: return "done";
  }
  return "?";
}

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::Eos: return "eos";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
  }
  return "?";
}

Scheduler::Scheduler(const SchedulerConfig& cfg, const KvAdmission& kv) : cfg_(cfg), kv_(kv) {
  validate(cfg_);
  NF4FLASH_CHECK(kv_.block_size() >= 1, "scheduler: KV block size must be >= 1 (got ", kv_.block_size(), ")");
  NF4FLASH_CHECK(kv_.total_blocks() >= 1, "scheduler: the KV cache has no block (total_blocks ",
                 kv_.total_blocks(), ")");
}

Scheduler::Seq& Scheduler::get(int64_t id) {
  auto it = seqs_.find(id);
  NF4FLASH_CHECK(it != seqs_.end(), "scheduler: sequence ", id, " is not live");
  return it->second;
}

SubmitResult Scheduler::submit(const SchedRequest& r) {
  const SubmitResult c = check(r);
  if (c.status == SubmitResult::Status::Rejected) {
    ++stats_.rejected;
    return c;
  }
  ++stats_.submitted;
  if (c.status == SubmitResult::Status::Finished) {  // nothing to generate: done without a prefill
    ++stats_.finished;
    return c;
  }
  Seq s;
  s.info.id = r.id;
  s.info.prompt_len = r.prompt_len;
  s.info.max_new_tokens = r.max_new_tokens;
  s.info.computed = r.cached_len;
  seqs_.emplace(r.id, s);
  waiting_.push_back(r.id);
  return SubmitResult{};
}

SubmitResult Scheduler::check(const SchedRequest& r) const {
  auto reject = [&](std::string msg) { return SubmitResult{SubmitResult::Status::Rejected, std::move(msg)}; };
  const int64_t P = r.prompt_len, M = r.max_new_tokens;
  if (seqs_.count(r.id)) return reject(cat("request ", r.id, ": id is already in use by a live sequence"));
  if (P < 1) return reject(cat("request ", r.id, ": empty prompt (prompt_len ", P, ")"));
  if (r.cached_len < 0 || r.cached_len >= P)
    return reject(cat("request ", r.id, ": cached_len ", r.cached_len, " must be in [0, prompt_len ", P,
                      ") (the last prompt token is always computed)"));
  if (M < 0) return reject(cat("request ", r.id, ": max_new_tokens ", M, " is negative"));
  if (P > cfg_.max_context || M > cfg_.max_context - P)
    return reject(cat("request ", r.id, ": prompt of ", P, " tokens + max_new_tokens ", M, " = ", P + M,
                      " tokens exceeds the context limit of ", cfg_.max_context, " tokens"));
  // The last generated token is never fed back, so the KV cache holds at most P + M - 1 positions.
  const int64_t bs = kv_.block_size(), total = kv_.total_blocks();
  const int64_t positions = P + std::max<int64_t>(M, 1) - 1;
  const int64_t blocks = (positions + bs - 1) / bs;
  if (blocks > total)
    return reject(cat("request ", r.id, ": prompt of ", P, " tokens + max_new_tokens ", M, " needs ", positions,
                      " KV positions (", blocks, " blocks of ", bs, "), more than the whole KV cache holds (",
                      total, " blocks = ", total * bs, " positions)"));
  if (M == 0) return SubmitResult{SubmitResult::Status::Finished, {}};
  return SubmitResult{};
}

int64_t Scheduler::fit_tokens(int64_t id, int64_t want, int64_t free) const {
  if (want <= 0 || free < 0) return 0;
  if (kv_.blocks_needed(id, want) <= free) return want;
  int64_t lo = 0, hi = want;  // blocks_needed(lo) <= free < blocks_needed(hi); it grows with n
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (kv_.blocks_needed(id, mid) <= free ? lo : hi) = mid;
  }
  return lo;
}

bool Scheduler::preempt_youngest(int64_t self, bool allow_self, StepPlan& p, int64_t& free) {
  for (size_t i = running_.size(); i-- > 0;) {
    const int64_t id = running_[i];
    Seq& v = get(id);
    if (id == self && !allow_self) return false;  // only younger sequences give way
    if (id != self && (v.info.state == SeqState::Done || v.planned == p.step)) continue;
    free += kv_.releasable_blocks(id);
    v.info.state = SeqState::Waiting;
    v.info.computed = 0;  // recomputed from position 0 (prompt + tokens generated so far)
    v.planned = p.step;  // not re-admitted in this step
    ++v.info.preemptions;
    ++stats_.preemptions;
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    waiting_.push_front(id);
    p.preempted.push_back(id);
    return true;
  }
  return false;
}

void Scheduler::add(StepPlan& p, Seq& s, int64_t n, bool decode, int64_t& free, int64_t blocks) {
  StepEntry e;
  e.seq_id = s.info.id;
  e.pos0 = s.info.computed;
  e.n_tokens = n;
  e.decode = decode;
  e.samples = s.info.computed + n == target(s);
  p.seqs.push_back(e);
  p.n_tokens += n;
  free -= blocks;
  s.planned = p.step;
}

StepPlan Scheduler::plan_step() {
  StepPlan p;
  p.step = stats_.steps++;
  int64_t free = kv_.available_blocks();
  auto budget = [&] { return cfg_.max_tokens_per_step - p.n_tokens; };
  auto chunk = [&](const Seq& s) {
    int64_t n = std::min(target(s) - s.info.computed, budget());
    return cfg_.max_prefill_chunk > 0 ? std::min(n, cfg_.max_prefill_chunk) : n;
  };

  // 1. Decodes, oldest first. Preemptions only remove younger sequences (or this one), so the
  //    entries before index i stay where they are.
  for (size_t i = 0; i < running_.size();) {
    const int64_t id = running_[i];
    Seq& s = get(id);
    if (s.info.state != SeqState::Decoding) {
      ++i;
      continue;
    }
    int64_t need = kv_.blocks_needed(id, 1);
    while (need > free && preempt_youngest(id, true, p, free)) {
      if (s.info.state == SeqState::Waiting) break;  // it was the youngest: it gave way itself
      need = kv_.blocks_needed(id, 1);
    }
    if (s.info.state == SeqState::Waiting) continue;  // erased at i; the next one moved there
    add(p, s, 1, true, free, need);
    ++i;
  }

  // 2. Running prefills, oldest first, each a chunk of the budget left that the free blocks hold.
  for (size_t i = 0; i < running_.size() && budget() > 0; ++i) {
    const int64_t id = running_[i];
    Seq& s = get(id);
    if (s.info.state != SeqState::Prefilling) continue;
    while (kv_.blocks_needed(id, 1) > free && preempt_youngest(id, false, p, free)) {
    }
    const int64_t n = fit_tokens(id, chunk(s), free);
    if (n > 0) add(p, s, n, false, free, kv_.blocks_needed(id, n));
  }

  // 3. Waiting sequences, FCFS, while a slot, budget and blocks for the whole first chunk remain
  //    (shrunk to the free blocks when the step would otherwise be empty).
  while (!waiting_.empty() && budget() > 0 && static_cast<int64_t>(running_.size()) < cfg_.max_seqs_per_step) {
    const int64_t id = waiting_.front();
    Seq& s = get(id);
    if (s.planned == p.step) break;  // preempted by this very step
    const int64_t want = chunk(s);
    int64_t n = kv_.blocks_needed(id, want) <= free ? want : 0;
    if (n == 0 && p.seqs.empty()) n = fit_tokens(id, want, free);
    if (n == 0) break;  // the head waits for blocks; no one overtakes it
    waiting_.pop_front();
    running_.push_back(id);
    s.info.state = SeqState::Prefilling;
    add(p, s, n, false, free, kv_.blocks_needed(id, n));
  }
  return p;
}

SeqState Scheduler::advance(int64_t seq_id, int64_t n_tokens) {
  Seq& s = get(seq_id);
  const SeqState st = s.info.state;
  NF4FLASH_CHECK(st == SeqState::Prefilling || st == SeqState::Decoding, "scheduler: sequence ", seq_id,
                 " advanced while ", to_string(st));
  const int64_t left = target(s) - s.info.computed;
  NF4FLASH_CHECK(n_tokens >= 1 && n_tokens <= left, "scheduler: sequence ", seq_id, " advanced by ", n_tokens,
                 " positions with ", left, " to compute");
  s.info.computed += n_tokens;
  if (s.info.computed == target(s)) {  // the step ended at the last known token: one was sampled
    ++s.info.generated;
    s.info.state = s.info.generated >= s.info.max_new_tokens ? SeqState::Done : SeqState::Decoding;
  }
  return s.info.state;
}

std::vector<int64_t> Scheduler::commit(const StepPlan& p) {
  std::vector<int64_t> done;
  for (const StepEntry& e : p.seqs) {
    auto it = seqs_.find(e.seq_id);
    if (it == seqs_.end()) continue;  // finished since the plan
    NF4FLASH_CHECK(it->second.info.computed == e.pos0 && it->second.planned == p.step, "scheduler: commit of step ",
                   p.step, ": sequence ", e.seq_id, " is at position ", it->second.info.computed,
                   ", the plan started it at ", e.pos0, " (plan out of date)");
    if (advance(e.seq_id, e.n_tokens) == SeqState::Done) done.push_back(e.seq_id);
  }
  return done;
}

bool Scheduler::finish(int64_t seq_id, FinishReason reason) {
  (void)reason;  // every reason ends the sequence the same way; the engine reports it
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return false;
  if (it->second.info.state == SeqState::Waiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq_id));
  } else {
    running_.erase(std::find(running_.begin(), running_.end(), seq_id));
  }
  seqs_.erase(it);
  ++stats_.finished;
  return true;
}

std::optional<SeqInfo> Scheduler::info(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return std::nullopt;
  return it->second.info;
}

}  // namespace nf4flash
