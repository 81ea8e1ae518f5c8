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
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n, chunk;
    int chunks;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunk = job_chunk_;
      chunks = job_chunks_;
    }
    if (index < chunks) {
      const int64_t b = index * chunk, e = std::min(n, b + chunk);
      if (b < e) (*job)(b, e);
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
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
  const int64_t chunk = (n + chunks - 1) / chunks;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_chunks_ = chunks;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_start_.notify_all();
  fn(0, std::min(n, chunk));
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
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
