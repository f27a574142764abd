#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace lily {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int idx) {
  size_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* fn = job_;
    size_t n = job_n_, chunk = job_chunk_;
    lk.unlock();
    size_t b = size_t(idx) * chunk;
    if (b < n) (*fn)(b, std::min(n, b + chunk));
    lk.lock();
    if (--pending_ == 0) cv_done_.notify_one();
  }
}

void ThreadPool::parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  size_t units = (n + grain - 1) / grain;
  if (n_threads_ == 1 || units == 1) {
    fn(0, n);
    return;
  }
  size_t chunk = ((units + n_threads_ - 1) / n_threads_) * grain;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  cv_start_.notify_all();
  fn(0, std::min(n, chunk));
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
}

static std::unique_ptr<ThreadPool>& global_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}

static int default_threads() {
  if (const char* e = std::getenv("LILY_THREADS")) {
    int v = std::atoi(e);
    if (v > 0) return v;
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc ? int(hc) : 1;
}

ThreadPool& ThreadPool::global() {
  auto& p = global_slot();
  if (!p) p = std::make_unique<ThreadPool>(default_threads());
  return *p;
}

void ThreadPool::set_global_threads(int n) { global_slot() = std::make_unique<ThreadPool>(n > 0 ? n : default_threads()); }

}  // namespace lily
