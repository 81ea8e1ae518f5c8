#include "core/thread_pool.h"

#include <algorithm>
#include <memory>

namespace nf4flash {

ThreadPool::ThreadPool(int n_threads) {
  const int n = std::max(1, n_threads);
  for (int i = 0; i + 1 < n; ++i) workers_.emplace_back([this, i] { worker_loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
// Spin iterations (a pause each, ~40 ns on current x86) before blocking: ~50 microseconds.
constexpr int kSpin = 1 << 11;
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int i = 0; i < kSpin && g == seen && !stop_.load(std::memory_order_relaxed); ++i) {
      cpu_relax();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_start_.wait(lk, [&] { return stop_.load() || generation_.load() != seen; });
      sleepers_.fetch_sub(1);
      g = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load()) return;
    seen = g;
    const int chunks = job_chunks_;
    if (index < chunks) {
      const int64_t b = index * job_chunk_, e = std::min(job_n_, b + job_chunk_);
      if (b < e) (*job_)(b, e);
    }
    // seq_cst with the caller's store of caller_asleep_ and load of pending_: one of the two sees
    // the other's write, so a caller that went to sleep is woken
    if (pending_.fetch_sub(1) == 1 && caller_asleep_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = std::max<int64_t>(1, n / grain);
  const int chunks = static_cast<int>(std::min<int64_t>(size(), max_chunks));
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  // a second caller while a job is out (ranks of a tensor-parallel group on threads of one
  // process) runs its range alone
  if (busy_.exchange(true, std::memory_order_acquire)) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + chunks - 1) / chunks;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  job_chunks_ = chunks;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    // under the mutex: a worker between its last spin and its wait sees either the new
    // generation or the notification
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleepers_.load() > 0) cv_start_.notify_all();
  fn(0, std::min(n, chunk));
  for (int i = 0; i < kSpin && pending_.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_asleep_.store(true);
    cv_done_.wait(lk, [&] { return pending_.load() == 0; });
    caller_asleep_.store(false);
  }
  job_ = nullptr;
  busy_.store(false, std::memory_order_release);
}

namespace {
int g_requested_threads = 0;
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mu;
}  // namespace

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  g_requested_threads = n;
  g_pool.reset();
}

int num_threads() { return thread_pool().size(); }

ThreadPool& thread_pool() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) {
    int n = g_requested_threads > 0 ? g_requested_threads
                                    : static_cast<int>(std::thread::hardware_concurrency());
    g_pool = std::make_unique<ThreadPool>(std::max(1, n));
  }
  return *g_pool;
}

}  // namespace nf4flash
