// ThreadPool: every index runs exactly once, back-to-back jobs (the spinning hand-off) and jobs
// after the workers fell asleep (the sleeping hand-off) alike.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace lily {
namespace {

// Runs one parallel_for over n items and checks each ran once, on at most size() threads.
void run_once(ThreadPool& pool, size_t n, size_t grain) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<int> chunks{0};
  pool.parallel_for(n, grain, [&](size_t b, size_t e) {
    ASSERT_LT(b, e);
    ASSERT_LE(e, n);
    chunks.fetch_add(1);
    for (size_t i = b; i < e; ++i) hits[i].fetch_add(1);
  });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i << " of " << n;
  EXPECT_LE(chunks.load(), pool.size());
}

TEST(ThreadPool, EveryItemOnceBackToBack) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int rep = 0; rep < 2000; ++rep) run_once(pool, size_t(1 + rep % 37), size_t(1 + rep % 5));
  }
}

TEST(ThreadPool, EveryItemOnceAfterTheWorkersSlept) {
  ThreadPool pool(4);
  for (int rep = 0; rep < 20; ++rep) {
    run_once(pool, 1000, 7);
    std::this_thread::sleep_for(ThreadPool::kSpin * 3);  // past the spin: the workers wait on the condition variable
  }
}

TEST(ThreadPool, TheCallerWaitsForASlowChunk) {
  ThreadPool pool(2);
  for (int rep = 0; rep < 5; ++rep) {
    std::atomic<int> done{0};
    pool.parallel_for(2, 1, [&](size_t b, size_t) {
      if (b == 1) std::this_thread::sleep_for(ThreadPool::kSpin * 4);  // the caller gives up spinning and sleeps
      done.fetch_add(1);
    });
    EXPECT_EQ(done.load(), 2);
  }
}

TEST(ThreadPool, DestroyedWhileIdleOrJustUsed) {
  for (int rep = 0; rep < 50; ++rep) {
    ThreadPool pool(3);
    if (rep % 2) run_once(pool, 64, 1);
  }
}

}  // namespace
}  // namespace lily
