#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LILY_PAUSE() _mm_pause()
#else
#define LILY_PAUSE() std::this_thread::yield()
#endif

namespace lily {
namespace {

// Spins until done() or kSpin has passed; true if done() came true. After the first rounds it
// yields between checks, so a thread that has work and shares this core (more threads than cores,
// other processes) gets to run.
template <class F>
bool spin_until(std::chrono::microseconds spin, F done) {
  if (spin.count() == 0) return done();
  const auto until = std::chrono::steady_clock::now() + spin;
  for (int round = 0;; ++round) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      LILY_PAUSE();
    }
    if (std::chrono::steady_clock::now() >= until) return done();
    if (round >= 16) std::this_thread::yield();
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads)
    : n_threads_(std::max(1, n_threads)),
      spin_(unsigned(n_threads_) <= std::max(1u, std::thread::hardware_concurrency()) ? kSpin : std::chrono::microseconds(0)) {
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  cv_start_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int idx) {
  uint64_t seen = 0;
  for (;;) {
    // Both sides use seq_cst on generation_ and sleepers_: either the caller sees this thread
    // asleep (and notifies under the lock), or this thread sees the new generation before it waits.
    if (!spin_until(spin_, [&] { return generation_.load() != seen || stop_.load(); })) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_start_.wait(lk, [&] { return generation_.load() != seen || stop_.load(); });
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    const auto* fn = job_;
    const size_t n = job_n_, chunk = job_chunk_;
    const size_t b = size_t(idx) * chunk;
    if (b < n) (*fn)(b, std::min(n, b + chunk));
    if (pending_.fetch_sub(1) == 1 && caller_asleep_.load()) {
      std::lock_guard<std::mutex> lk(mu_);
      cv_done_.notify_one();
    }
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
  const size_t chunk = ((units + n_threads_ - 1) / n_threads_) * grain;
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  pending_.store(n_threads_ - 1);
  generation_.fetch_add(1);  // publishes the job (seq_cst, a release)
  if (sleepers_.load() > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    cv_start_.notify_all();
  }
  fn(0, std::min(n, chunk));
  if (!spin_until(spin_, [&] { return pending_.load() == 0; })) {
    std::unique_lock<std::mutex> lk(mu_);
    caller_asleep_.store(true);
    cv_done_.wait(lk, [&] { return pending_.load() == 0; });
    caller_asleep_.store(false);
  }
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
