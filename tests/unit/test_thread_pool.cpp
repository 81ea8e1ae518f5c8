// ThreadPool: every index of every job is run exactly once, whether the workers are spinning
// (jobs back to back) or asleep (a pause longer than the spin between jobs), and pools of several
// sizes start and stop cleanly; several threads may call one pool at once.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

using namespace nf4flash;

namespace {

void run_jobs(ThreadPool& pool, int jobs, std::chrono::microseconds pause) {
  std::vector<std::atomic<int>> hits(1000);
  for (int j = 0; j < jobs; ++j) {
    const int64_t n = 1 + (j * 37) % 1000, grain = 1 + j % 7;
    for (int64_t i = 0; i < n; ++i) hits[i].store(0);
    pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
      ASSERT_LE(0, b);
      ASSERT_LE(b, e);
      ASSERT_LE(e, n);
      for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "job " << j << " index " << i;
    if (pause.count() > 0) std::this_thread::sleep_for(pause);
  }
}

}  // namespace

TEST(ThreadPool, BackToBackJobsRunEveryIndexOnce) {
  for (int threads : {2, 3, 8}) {
    ThreadPool pool(threads);
    run_jobs(pool, 5000, std::chrono::microseconds(0));
  }
}

TEST(ThreadPool, JobsAfterTheWorkersSleptRunEveryIndexOnce) {
  ThreadPool pool(4);
  run_jobs(pool, 40, std::chrono::microseconds(2000));  // 2 ms: past the ~50 us spin
}

TEST(ThreadPool, PoolsStartAndStop) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(1 + i % 5);
    if (i % 2) run_jobs(pool, 3, std::chrono::microseconds(0));
  }
}

// Several threads driving jobs through one pool at once (tensor-parallel ranks of one process):
// every job of every thread still runs each index exactly once.
TEST(ThreadPool, ConcurrentCallersRunEveryIndexOnce) {
  ThreadPool pool(3);
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) callers.emplace_back([&] { run_jobs(pool, 2000, std::chrono::microseconds(0)); });
  for (auto& t : callers) t.join();
}
