// Scheduler test helpers: a fake paged KV cache that counts blocks (a sequence's table holds
// ceil(positions / block_size) blocks; nothing is shared), and a driver that plays the engine's
// part of a step (release the preempted, reserve the plan, sample, finish, commit) and checks every
// plan against the limits and the fake's tables.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/scheduler.h"

namespace nf4flash::test {

class FakeKv : public KvAdmission {
 public:
  FakeKv(int64_t total_blocks, int block_size) : total_(total_blocks), bs_(block_size) {}

  int64_t blocks_needed(int64_t id, int64_t n_more) const override {
    const int64_t h = tokens(id);
    return blocks(h + n_more) - blocks(h);
  }
  int64_t releasable_blocks(int64_t id) const override { return blocks(tokens(id)); }
  int64_t available_blocks() const override { return total_ - used_ - external_; }
  int64_t total_blocks() const override { return total_; }
  int block_size() const override { return bs_; }

  // The engine's side. reserve() fails the test when the pool cannot hold the positions.
  void reserve(int64_t id, int64_t n) {
    const int64_t need = blocks_needed(id, n);
    ASSERT_LE(need, available_blocks()) << "sequence " << id << " reserves " << n << " positions";
    tokens_[id] += n;
    used_ += need;
  }
  void release(int64_t id) {
    used_ -= blocks(tokens(id));
    tokens_.erase(id);
  }
  int64_t tokens(int64_t id) const {
    auto it = tokens_.find(id);
    return it == tokens_.end() ? 0 : it->second;
  }
  int64_t used() const { return used_; }
  size_t tables() const { return tokens_.size(); }
  void set_external(int64_t blocks) { external_ = blocks; }  // blocks held outside the scheduler

 private:
  int64_t blocks(int64_t positions) const { return (positions + bs_ - 1) / bs_; }
  int64_t total_;
  int bs_;
  int64_t used_ = 0, external_ = 0;
  std::map<int64_t, int64_t> tokens_;
};

// One line per plan: "id@pos0+n" per entry (d = decode, s = samples), then the preempted ids.
inline std::string describe(const StepPlan& p) {
  std::ostringstream os;
  os << p.step << ":";
  for (const StepEntry& e : p.seqs) os << " " << e.seq_id << "@" << e.pos0 << "+" << e.n_tokens << (e.decode ? "d" : "") << (e.samples ? "s" : "");
  if (!p.preempted.empty()) {
    os << " |";
    for (int64_t id : p.preempted) os << " -" << id;
  }
  return os.str();
}

struct Driver {
  FakeKv kv;
  Scheduler s;
  std::vector<StepPlan> plans;
  std::map<int64_t, FinishReason> finished;
  std::map<int64_t, int64_t> sampled;  // tokens sampled per sequence
  // Whether the token a sequence samples as its n-th (1-based) is an end-of-sequence token.
  std::function<bool(int64_t id, int64_t nth)> eos;

  Driver(const SchedulerConfig& c, int64_t total_blocks, int block_size)
      : kv(total_blocks, block_size), s(c, kv) {}

  SubmitResult submit(int64_t id, int64_t prompt, int64_t max_new, int64_t cached = 0) {
    if (cached > 0) kv.reserve(id, cached);  // the prefix attached before submit
    SubmitResult r = s.submit({id, prompt, cached, max_new});
    if (r.status == SubmitResult::Status::Finished) finished[id] = FinishReason::Length;
    if (r.status != SubmitResult::Status::Accepted) kv.release(id);
    return r;
  }

  StepPlan step() {
    StepPlan p = s.plan_step();
    const SchedulerConfig& c = s.config();
    EXPECT_LE(static_cast<int64_t>(p.seqs.size()), c.max_seqs_per_step) << describe(p);
    EXPECT_LE(p.n_tokens, c.max_tokens_per_step) << describe(p);
    int64_t sum = 0;
    std::set<int64_t> ids;
    for (const StepEntry& e : p.seqs) {
      sum += e.n_tokens;
      EXPECT_TRUE(ids.insert(e.seq_id).second) << "twice in one step: " << describe(p);
      EXPECT_GE(e.n_tokens, 1) << describe(p);
      if (c.max_prefill_chunk > 0 && !e.decode) EXPECT_LE(e.n_tokens, c.max_prefill_chunk) << describe(p);
    }
    EXPECT_EQ(sum, p.n_tokens);
    for (int64_t id : p.preempted) kv.release(id);
    for (const StepEntry& e : p.seqs) {
      EXPECT_EQ(e.pos0, kv.tokens(e.seq_id)) << "sequence " << e.seq_id << ": " << describe(p);
      kv.reserve(e.seq_id, e.n_tokens);
    }
    for (const StepEntry& e : p.seqs) {
      if (!e.samples) continue;
      const int64_t nth = ++sampled[e.seq_id];
      if (eos && eos(e.seq_id, nth)) end(e.seq_id, FinishReason::Eos);
    }
    for (int64_t id : s.commit(p)) end(id, FinishReason::Length);
    plans.push_back(p);
    return p;
  }

  void end(int64_t id, FinishReason r) {
    EXPECT_TRUE(s.finish(id, r));
    kv.release(id);
    finished[id] = r;
  }

  // Steps until no work is left (at most max_steps); returns the steps run.
  int64_t run(int64_t max_steps) {
    int64_t n = 0;
    while (s.has_work() && n < max_steps) {
      step();
      ++n;
    }
    return n;
  }

  // Whether `id` is in the plan, and with how many tokens.
  static int64_t tokens_of(const StepPlan& p, int64_t id) {
    for (const StepEntry& e : p.seqs)
      if (e.seq_id == id) return e.n_tokens;
    return 0;
  }
};

inline SchedulerConfig config(int64_t seqs, int64_t tokens, int64_t chunk = 0, int64_t context = 1 << 20) {
  SchedulerConfig c;
  c.max_seqs_per_step = seqs;
  c.max_tokens_per_step = tokens;
  c.max_prefill_chunk = chunk;
  c.max_context = context;
  return c;
}

}  // namespace nf4flash::test
