// A small persistent thread pool with a blocking parallel_for. One global pool sized from
// --threads (default: hardware concurrency); callers split work into contiguous ranges.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nf4flash {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) split into about size() contiguous chunks of at least
  // `grain` items; blocks until all are done. The calling thread takes part. Safe to call from
  // several threads at once: while one call's job is out, the others run fn(0, n) themselves.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  // A job is published by bumping generation_ (release) after its fields are written; workers
  // and the caller spin on generation_ / pending_ for a short while before sleeping on the
  // condition variables (a decode step hands out a few hundred jobs of tens of microseconds).
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0;
  int job_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};     // workers blocked on cv_start_
  std::atomic<bool> caller_asleep_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};  // a job is out
};

// The process-wide pool. set_num_threads() before first use to choose its size (0 = all cores).
ThreadPool& thread_pool();
void set_num_threads(int n);
int num_threads();

}  // namespace nf4flash
