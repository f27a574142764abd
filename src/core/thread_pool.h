// A fixed pool of worker threads with a blocking parallel_for over [0, n).
// One pool per process (threads never oversubscribe the cores); work is split in contiguous
// chunks so each thread streams its own range of weight rows.
//
// Hand-off: a decode step calls parallel_for ~270 times (40 layers × 6–7 ops), tens of µs apart.
// Waking a sleeping thread through a condition variable costs a futex round trip and a
// reschedule each time (26 µs a call on the quiet 2-core dev VM, 170 µs while a build ran; 5–9 µs
// spinning; docs/perf/2026-12-06-cpu-decode.md), so both sides
// first spin on atomics for up to kSpin (workers waiting for the next job, the caller waiting for
// the last chunk), and only then sleep. An idle pool sleeps. A pool of more threads than the
// machine has cores never spins: a spinning thread would hold the core a working one needs.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace lily {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Calls fn(begin, end) on disjoint chunks covering [0, n); returns when all are done.
  // Chunks are multiples of `grain` (except the last). Safe to call from one thread at a time.
  void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

  // The process-wide pool (threads = LILY_THREADS env or hardware concurrency).
  static ThreadPool& global();
  static void set_global_threads(int n);

  // How long a thread spins before it sleeps (see above).
  static constexpr std::chrono::microseconds kSpin{100};

 private:
  void worker(int idx);
  int n_threads_;
  std::chrono::microseconds spin_;  // kSpin, or 0 when oversubscribed
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  // The job: written by the caller before generation_ is bumped (release), read after (acquire).
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0, job_chunk_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};    // workers still running the current job
  std::atomic<int> sleepers_{0};   // workers asleep on cv_start_
  std::atomic<bool> caller_asleep_{false};
  std::atomic<bool> stop_{false};
};

}  // namespace lily
