// The continuous-batching policy (runtime/scheduler.h) against a block-counting fake KV cache:
// configuration and submit checks, decode-only steps, chunked prefill beside running decodes, FCFS,
// limits, KV exhaustion and preemption, sequences leaving and joining, thousands of tiny requests,
// determinism.
#include <chrono>
#include <random>

#include "core/error.h"
#include "unit/test_scheduler_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

void expect_error(const SchedulerConfig& c, const std::string& needle) {
  FakeKv kv(16, 4);
  try {
    Scheduler s(c, kv);
    ADD_FAILURE() << "no error for " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SchedulerConfig, NonsenseIsAnError) {
  expect_error(config(0, 16), "max_seqs_per_step");
  expect_error(config(8, 4), "max_tokens_per_step");
  expect_error(config(4, 16, -1), "max_prefill_chunk");
  expect_error(config(4, 16, 0, 0), "max_context");
  FakeKv empty(0, 4), zero_bs(16, 0);
  FakeKv one(1, 1);
  EXPECT_THROW(Scheduler s(config(4, 16), empty), Error);
  EXPECT_THROW(Scheduler s(config(4, 16), zero_bs), Error);
  EXPECT_NO_THROW(Scheduler s(config(4, 4), one));
}

TEST(SchedulerSubmit, WhatCanNeverFitIsRejectedWithTheSizes) {
  Driver d(config(4, 64, 0, 256), 8, 16);  // 128 positions
  SubmitResult r = d.submit(42, 200, 10);
  EXPECT_EQ(r.status, SubmitResult::Status::Rejected);
  for (const char* part : {"request 42", "200 tokens", "max_new_tokens 10", "209 KV positions", "128 positions"})
    EXPECT_NE(r.error.find(part), std::string::npos) << r.error;
  r = d.submit(7, 100, 200);  // fits the pool? no matter: over the context limit
  EXPECT_EQ(r.status, SubmitResult::Status::Rejected);
  EXPECT_NE(r.error.find("request 7"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("context limit of 256"), std::string::npos) << r.error;
  // The last generated token is never fed back: 100 + 29 - 1 = 128 positions fit exactly.
  EXPECT_EQ(d.submit(1, 100, 29).status, SubmitResult::Status::Accepted);
  EXPECT_EQ(d.submit(2, 100, 30).status, SubmitResult::Status::Rejected);
  EXPECT_NE(d.submit(1, 4, 4).error.find("already in use"), std::string::npos);
  EXPECT_NE(d.submit(3, 0, 4).error.find("empty prompt"), std::string::npos);
  EXPECT_NE(d.submit(4, 4, 4, 4).error.find("cached_len 4"), std::string::npos);
  EXPECT_NE(d.submit(5, 4, -1).error.find("negative"), std::string::npos);
  EXPECT_EQ(d.s.stats().rejected, 7);
  EXPECT_EQ(d.s.n_waiting(), 1);  // only request 1
  EXPECT_EQ(d.run(100), 30);      // two prefill steps (64 + 36 tokens) + 28 decodes
  EXPECT_EQ(d.kv.used(), 0);
}

TEST(SchedulerSubmit, MaxNewTokensZeroFinishesAtOnceWithoutPrefill) {
  Driver d(config(4, 64), 64, 4);
  SubmitResult r = d.submit(1, 10, 0);
  EXPECT_EQ(r.status, SubmitResult::Status::Finished);
  EXPECT_TRUE(r.ok());
  EXPECT_FALSE(d.s.has_work());
  EXPECT_FALSE(d.s.info(1).has_value());
  EXPECT_TRUE(d.s.plan_step().empty());
  // max_new_tokens 1: the prefill's sampled token is the only one; no decode step.
  d.submit(2, 10, 1);
  StepPlan p = d.step();
  EXPECT_EQ(describe(p), "1: 2@0+10s");
  EXPECT_EQ(d.finished.at(2), FinishReason::Length);
  EXPECT_FALSE(d.s.has_work());
}

TEST(SchedulerSubmit, CachedPrefixIsNotRecomputed) {
  Driver d(config(4, 64), 64, 4);
  d.submit(1, 12, 3, 8);  // 8 prompt tokens already in the cache (2 blocks held)
  EXPECT_EQ(d.s.info(1)->computed, 8);
  EXPECT_EQ(describe(d.step()), "0: 1@8+4s");
  EXPECT_EQ(describe(d.step()), "1: 1@12+1ds");
  d.run(10);
  EXPECT_EQ(d.sampled.at(1), 3);
  EXPECT_EQ(d.kv.used(), 0);
}

TEST(SchedulerStep, DecodeOnlySteps) {
  Driver d(config(4, 64), 64, 4);
  for (int64_t id = 1; id <= 3; ++id) d.submit(id, 1 + id, 4);
  EXPECT_EQ(describe(d.step()), "0: 1@0+2s 2@0+3s 3@0+4s");
  EXPECT_EQ(describe(d.step()), "1: 1@2+1ds 2@3+1ds 3@4+1ds");
  EXPECT_EQ(describe(d.step()), "2: 1@3+1ds 2@4+1ds 3@5+1ds");
  EXPECT_EQ(d.s.info(2)->state, SeqState::Decoding);
  EXPECT_EQ(d.s.info(2)->generated, 3);
  d.step();
  EXPECT_FALSE(d.s.has_work());
  for (int64_t id = 1; id <= 3; ++id) EXPECT_EQ(d.sampled.at(id), 4);
}

TEST(SchedulerStep, LongPromptIsChunkedWhileEveryDecodeKeepsRunning) {
  Driver d(config(8, 64), 1024, 16);
  for (int64_t id = 1; id <= 3; ++id) d.submit(id, 4, 200);
  d.step();  // the three short prompts
  d.submit(9, 1000, 5);
  int64_t prefilled = 0, steps = 0;
  while (d.s.info(9)->state != SeqState::Decoding) {
    StepPlan p = d.step();
    ++steps;
    for (int64_t id = 1; id <= 3; ++id) EXPECT_EQ(Driver::tokens_of(p, id), 1) << describe(p);
    EXPECT_EQ(Driver::tokens_of(p, 9), std::min<int64_t>(61, 1000 - prefilled)) << describe(p);
    prefilled += Driver::tokens_of(p, 9);
  }
  EXPECT_EQ(steps, (1000 + 60) / 61);  // admitted in the first step after submit, 61 tokens a step
  EXPECT_EQ(d.s.info(9)->computed, 1000);
}

TEST(SchedulerStep, ChunkCapLetsASecondLongPromptStartAtOnce) {
  Driver d(config(8, 64, 16), 1024, 16);
  d.submit(1, 4, 100);
  d.step();
  d.submit(2, 500, 5);
  d.submit(3, 500, 5);
  // decode of 1, then 16-token chunks: the older prompt first, the newer one in the same step.
  EXPECT_EQ(describe(d.step()), "1: 1@4+1ds 2@0+16 3@0+16");
  EXPECT_EQ(describe(d.step()), "2: 1@5+1ds 2@16+16 3@16+16");
}

TEST(SchedulerStep, WaitingRequestsAreAdmittedFirstComeFirstServed) {
  Driver d(config(2, 64), 256, 4);
  for (int64_t id = 1; id <= 6; ++id) d.submit(id, 8, 3);
  std::vector<int64_t> order;
  std::set<int64_t> seen;
  d.run(100);
  for (const StepPlan& p : d.plans)
    for (const StepEntry& e : p.seqs)
      if (seen.insert(e.seq_id).second) order.push_back(e.seq_id);
  EXPECT_EQ(order, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  // Under block pressure the head waits and no one overtakes it: 2 does not fit beside 1, 3 would.
  Driver b(config(4, 64), 8, 4);  // 32 positions
  b.submit(1, 16, 8);             // 4 blocks now, up to 6
  b.submit(2, 20, 2);             // 5 blocks
  b.submit(3, 4, 2);              // 1 block
  EXPECT_EQ(describe(b.step()), "0: 1@0+16s");
  EXPECT_EQ(b.s.info(2)->state, SeqState::Waiting);
  EXPECT_EQ(b.s.info(3)->state, SeqState::Waiting);
  b.run(100);
  EXPECT_EQ(b.finished.size(), 3u);
}

TEST(SchedulerStep, TokenAndSequenceLimitsAreRespected) {
  Driver d(config(3, 10), 256, 4);
  for (int64_t id = 1; id <= 5; ++id) d.submit(id, 7, 2);
  EXPECT_EQ(describe(d.step()), "0: 1@0+7s 2@0+3");      // budget 10: 7 + 3
  EXPECT_EQ(describe(d.step()), "1: 1@7+1ds 2@3+4s 3@0+5");  // 3 sequences at most
  EXPECT_EQ(d.finished.count(1), 1u);
  EXPECT_EQ(describe(d.step()), "2: 2@7+1ds 3@5+2s 4@0+7s");
  d.run(100);  // every plan is checked against both limits by the driver
  EXPECT_EQ(d.finished.size(), 5u);
}

TEST(SchedulerKv, ExhaustedPoolMeansWaitingThenAdmission) {
  Driver d(config(4, 64), 4, 4);  // 16 positions
  d.submit(1, 12, 2);             // 3 blocks for the prompt, 4 with its one decode
  EXPECT_TRUE(d.submit(2, 8, 1).ok());  // 2 blocks: must wait, not fail
  EXPECT_EQ(describe(d.step()), "0: 1@0+12s");
  EXPECT_EQ(d.s.info(2)->state, SeqState::Waiting);
  EXPECT_EQ(describe(d.step()), "1: 1@12+1ds");  // 1 finishes (length)
  EXPECT_EQ(describe(d.step()), "2: 2@0+8s");
  EXPECT_FALSE(d.s.has_work());
  EXPECT_EQ(d.kv.used(), 0);
}

TEST(SchedulerKv, DecodeThatNeedsABlockPreemptsTheYoungest) {
  Driver d(config(4, 64), 4, 4);  // 16 positions; each sequence needs 3 blocks at the end
  d.submit(1, 4, 9);
  d.submit(2, 4, 9);
  d.run(5);  // prefills, then decodes at positions 4..7 (one new block each at position 4)
  StepPlan p = d.step();
  EXPECT_EQ(describe(p), "5: 1@8+1ds | -2");
  EXPECT_EQ(d.s.info(2)->state, SeqState::Waiting);
  EXPECT_EQ(d.s.info(2)->computed, 0);
  EXPECT_EQ(d.s.info(2)->generated, 5);
  d.run(100);
  EXPECT_EQ(d.sampled.at(1), 9);
  EXPECT_EQ(d.sampled.at(2), 9);  // recomputed: prompt + 5 tokens, then the rest
  EXPECT_EQ(d.s.stats().preemptions, 1);
  EXPECT_EQ(d.kv.used(), 0);
  bool recomputed = false;
  for (const StepPlan& q : d.plans) recomputed |= describe(q).find("2@0+9s") != std::string::npos;
  EXPECT_TRUE(recomputed);
}

TEST(SchedulerKv, YoungestDecodeGivesWayToAnOlderPrefill) {
  Driver d(config(4, 8, 6), 6, 4);  // 24 positions
  d.submit(1, 20, 1);               // 5 blocks, prefilled 6 tokens a step
  d.submit(2, 2, 10);               // younger, decoding from step 1
  EXPECT_EQ(describe(d.step()), "0: 1@0+6 2@0+2s");
  EXPECT_EQ(describe(d.step()), "1: 2@2+1ds 1@6+6");
  EXPECT_EQ(describe(d.step()), "2: 2@3+1ds 1@12+6");
  EXPECT_EQ(describe(d.step()), "3: 1@18+2s | -2");  // 2 needs a block; only itself is younger
  EXPECT_EQ(describe(d.step()), "4: 2@0+5s");         // recompute 2 + 3 generated
  d.run(100);
  EXPECT_EQ(d.sampled.at(2), 10);
}

TEST(SchedulerKv, NoEmptyStepWhileABlockIsFree) {
  Driver d(config(4, 64), 10, 4);
  d.kv.set_external(8);  // the other 8 blocks are held elsewhere (e.g. attached prefixes)
  d.submit(1, 20, 1);    // 5 blocks; its 20-token chunk does not fit 2 free blocks
  EXPECT_EQ(describe(d.step()), "0: 1@0+8");  // shrunk to the free blocks rather than nothing
  EXPECT_TRUE(d.step().empty());              // no block is free: nothing can run
  d.kv.set_external(0);
  EXPECT_EQ(describe(d.step()), "2: 1@8+12s");
}

TEST(SchedulerStep, EosMidBatchLetsAWaitingSequenceJoinNextStep) {
  Driver d(config(2, 64), 256, 4);
  d.eos = [](int64_t id, int64_t nth) { return id == 1 && nth == 3; };
  for (int64_t id = 1; id <= 3; ++id) d.submit(id, 3, 100);
  EXPECT_EQ(describe(d.step()), "0: 1@0+3s 2@0+3s");
  d.step();
  EXPECT_EQ(describe(d.step()), "2: 1@4+1ds 2@4+1ds");  // 1 samples EOS here
  EXPECT_EQ(d.finished.at(1), FinishReason::Eos);
  EXPECT_EQ(describe(d.step()), "3: 2@5+1ds 3@0+3s");
  EXPECT_FALSE(d.s.finish(1, FinishReason::Stop));  // no longer live
  EXPECT_TRUE(d.s.finish(3, FinishReason::Abort));   // a client going away
  d.kv.release(3);
  EXPECT_EQ(describe(d.step()), "4: 2@6+1ds");
}

TEST(SchedulerStep, CommitOfAStalePlanIsAnError) {
  Driver d(config(2, 64), 256, 4);
  d.submit(1, 3, 10);
  StepPlan p = d.s.plan_step();
  d.s.commit(p);
  EXPECT_THROW(d.s.commit(p), Error);
  EXPECT_THROW(d.s.advance(1, 2), Error);  // a decode computes one position
  EXPECT_THROW(d.s.advance(99, 1), Error);
}

// Thousands of tiny requests arriving a few per step, in a tight pool: all finish, within a bound
// on steps and time, and the fake holds no block at the end.
std::vector<std::string> tiny_requests(int64_t n, int64_t* steps_out, SchedulerStats* stats_out) {
  Driver d(config(8, 24, 8, 64), 24, 4);
  std::mt19937_64 rng(1234);
  d.eos = [](int64_t id, int64_t nth) { return (id * 7 + nth) % 11 == 0; };
  int64_t next = 0, accepted = 0, steps = 0;
  while ((next < n || d.s.has_work()) && steps < 50 * n) {
    for (int k = 0; k < 3 && next < n; ++k, ++next) {
      const int64_t prompt = 1 + static_cast<int64_t>(rng() % 12), max_new = static_cast<int64_t>(rng() % 7);
      accepted += d.submit(next, prompt, max_new).status == SubmitResult::Status::Accepted;
    }
    d.step();
    ++steps;
  }
  EXPECT_FALSE(d.s.has_work());
  EXPECT_EQ(static_cast<int64_t>(d.finished.size()), n);
  EXPECT_EQ(d.kv.used(), 0);
  EXPECT_EQ(d.kv.tables(), 0u);
  EXPECT_EQ(d.s.stats().finished, n);
  EXPECT_GT(accepted, n / 2);
  std::vector<std::string> log;
  for (const StepPlan& p : d.plans) log.push_back(describe(p));
  *steps_out = steps;
  *stats_out = d.s.stats();
  return log;
}

TEST(SchedulerStress, ThousandsOfTinyRequestsAllFinishWithNoLeakedBlock) {
  const auto t0 = std::chrono::steady_clock::now();
  int64_t steps = 0;
  SchedulerStats st;
  tiny_requests(5000, &steps, &st);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(steps, 20000);
  EXPECT_LT(secs, 10.0);
  EXPECT_GT(st.preemptions, 0);  // the pool is tight enough to exercise preemption
  RecordProperty("steps", static_cast<int>(steps));
  RecordProperty("preemptions", static_cast<int>(st.preemptions));
}

TEST(SchedulerStress, SameInputsGiveTheSamePlans) {
  int64_t s1 = 0, s2 = 0;
  SchedulerStats a, b;
  const auto l1 = tiny_requests(1500, &s1, &a), l2 = tiny_requests(1500, &s2, &b);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(a.preemptions, b.preemptions);
}

}  // namespace
