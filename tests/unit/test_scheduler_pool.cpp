// The scheduler over a real KvBlockPool (PoolAdmission), with a simulated engine step: release the
// preempted, reserve every entry (the pool must hold what the plan promised), cache the full
// blocks, sample (a seeded EOS now and then), commit. A tiny pool with many requests sharing a
// prefix: the pool's invariants hold after every step, requests wait rather than fail, what can
// never fit is rejected with its id, and no block is held once all have finished. A cached prefix
// is not prefilled again.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/error.h"
#include "kv/block_pool.h"
#include "runtime/kv_admission.h"
#include "runtime/scheduler.h"

namespace nf4flash {
namespace {

struct Sim {
  KvBlockPool pool;
  PoolAdmission kv;
  Scheduler sched;
  std::map<int64_t, std::vector<int32_t>> tokens;  // prompt + generated, per live sequence
  std::mt19937 rng{7};
  double p_eos = 0.0;
  int64_t steps = 0, copies = 0, finished = 0;

  Sim(int64_t blocks, int block_size, const SchedulerConfig& c) : pool(blocks, block_size), kv(pool), sched(c, kv) {}

  SubmitResult submit(int64_t id, const std::vector<int32_t>& prompt, int64_t max_new) {
    const int64_t cached = kv.start(id, prompt);
    const SubmitResult r = sched.submit({id, int64_t(prompt.size()), cached, max_new});
    if (r.status == SubmitResult::Status::Accepted) tokens[id] = prompt;
    else kv.release(id);
    return r;
  }

  StepPlan step() {
    const StepPlan p = sched.plan_step();
    for (int64_t id : p.preempted) kv.release(id);
    std::vector<KvBlockCopy> cp;
    for (const StepEntry& e : p.seqs) kv.reserve(e, &cp);
    copies += int64_t(cp.size());
    for (const StepEntry& e : p.seqs) {
      std::vector<int32_t>& t = tokens.at(e.seq_id);
      kv.computed(e.seq_id, t);
      if (!e.samples) continue;
      t.push_back(int32_t(rng() % 50));
      if (std::bernoulli_distribution(p_eos)(rng)) {
        sched.finish(e.seq_id, FinishReason::Eos);
        end(e.seq_id);
      }
    }
    for (int64_t id : sched.commit(p)) {
      sched.finish(id, FinishReason::Length);
      end(id);
    }
    kv.check();
    ++steps;
    return p;
  }

  void end(int64_t id) {
    kv.release(id);
    tokens.erase(id);
    ++finished;
  }
};

std::vector<int32_t> prompt_with_prefix(const std::vector<int32_t>& prefix, int64_t extra, std::mt19937& g) {
  std::vector<int32_t> p = prefix;
  for (int64_t i = 0; i < extra; ++i) p.push_back(int32_t(100 + g() % 900));
  return p;
}

TEST(SchedulerPool, TinyPoolManyRequestsNoLeakNoOverrun) {
  SchedulerConfig c;
  c.max_seqs_per_step = 6;
  c.max_tokens_per_step = 24;
  c.max_context = 64;
  Sim sim(24, 4, c);  // 96 positions in all
  sim.p_eos = 0.1;
  std::mt19937 g(11);
  const std::vector<int32_t> system = {1, 2, 3, 4, 5, 6, 7, 8};  // two whole blocks every prompt shares
  int64_t accepted = 0, rejected = 0;
  for (int64_t id = 0; id < 300; ++id) {
    const bool shared = id % 2 == 0;
    const auto prompt = prompt_with_prefix(shared ? system : std::vector<int32_t>{}, 1 + g() % 20, g);
    const int64_t max_new = id % 37 == 0 ? 60 : int64_t(g() % 12);  // a few too long for the context
    const SubmitResult r = sim.submit(id, prompt, max_new);
    if (r.status == SubmitResult::Status::Rejected) {
      ++rejected;
      EXPECT_NE(r.error.find(std::to_string(id)), std::string::npos) << r.error;
    } else if (r.status == SubmitResult::Status::Accepted) {
      ++accepted;
    }
    if (id % 5 == 4) sim.step();  // requests keep arriving while steps run
  }
  while (sim.sched.has_work() && sim.steps < 20000) {
    const StepPlan p = sim.step();
    EXPECT_LE(int64_t(p.seqs.size()), c.max_seqs_per_step);
    EXPECT_LE(p.n_tokens, c.max_tokens_per_step);
  }
  EXPECT_FALSE(sim.sched.has_work()) << "stuck after " << sim.steps << " steps";
  EXPECT_GT(sim.steps, 100);
  EXPECT_GT(accepted, 250);
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(sim.finished, accepted);
  EXPECT_EQ(sim.kv.n_tables(), 0u);
  EXPECT_EQ(sim.pool.available_blocks(), sim.pool.n_blocks()) << "blocks leaked";
  EXPECT_GT(sim.pool.cached_blocks(), 0) << "the shared prefix was never cached";
  sim.kv.check();
}

TEST(SchedulerPool, CachedPrefixIsNotPrefilledAgain) {
  SchedulerConfig c;
  c.max_context = 256;
  Sim sim(64, 4, c);
  std::mt19937 g(3);
  const auto prompt = prompt_with_prefix({}, 13, g);  // 3 whole blocks + 1 token
  ASSERT_EQ(sim.submit(1, prompt, 4).status, SubmitResult::Status::Accepted);
  const StepPlan first = sim.step();
  ASSERT_EQ(first.seqs.size(), 1u);
  EXPECT_EQ(first.seqs[0].pos0, 0);
  EXPECT_EQ(first.seqs[0].n_tokens, 13);
  while (sim.sched.has_work()) sim.step();
  // the same prompt again: its 3 whole blocks come from the cache, only the last token is computed
  ASSERT_EQ(sim.submit(2, prompt, 4).status, SubmitResult::Status::Accepted);
  const StepPlan again = sim.step();
  ASSERT_EQ(again.seqs.size(), 1u);
  EXPECT_EQ(again.seqs[0].pos0, 12);
  EXPECT_EQ(again.seqs[0].n_tokens, 1);
  while (sim.sched.has_work()) sim.step();
  EXPECT_EQ(sim.pool.available_blocks(), sim.pool.n_blocks());
}

TEST(SchedulerPool, ReleasableCountsOnlyWhatTheTableAloneHolds) {
  SchedulerConfig c;
  c.max_context = 256;
  Sim sim(32, 4, c);
  std::mt19937 g(5);
  const auto prompt = prompt_with_prefix({}, 9, g);  // 2 whole blocks + 1
  ASSERT_TRUE(sim.submit(1, prompt, 3).ok());
  sim.step();  // prefill: 3 blocks, the 2 full ones cached
  EXPECT_EQ(sim.kv.releasable_blocks(1), 3);  // cached blocks become evictable, the last one free
  ASSERT_TRUE(sim.submit(2, prompt, 3).ok());  // shares the 2 cached blocks
  EXPECT_EQ(sim.kv.releasable_blocks(2), 0);
  EXPECT_EQ(sim.kv.releasable_blocks(1), 1);  // its shared blocks stay held by sequence 2
  while (sim.sched.has_work()) sim.step();
  EXPECT_EQ(sim.pool.available_blocks(), sim.pool.n_blocks());
}

}  // namespace
}  // namespace nf4flash
