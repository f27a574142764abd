// A fixed pool of worker threads with a blocking parallel_for over [0, n).
// One pool per process (threads never oversubscribe the cores); work is split in contiguous
// chunks so each thread streams its own range of weight rows.
#pragma once
#include <condition_variable>
#include <cstddef>
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

 private:
  void worker(int idx);
  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0, job_chunk_ = 0;
  size_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace lily
