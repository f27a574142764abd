// Read-bandwidth measurement for the CPU benchmarks (see fast_membw.h).
#include "backend/cpu/fast_membw.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <vector>

#include "backend/cpu/fast_ops.h"
#include "core/thread_pool.h"

namespace lily::cpu::fast {

double measure_read_gbps(double gib) {
  using clk = std::chrono::steady_clock;
  const size_t n = size_t(gib * (1u << 30)) / sizeof(float);
  std::vector<float> buf(n);
  ThreadPool::global().parallel_for(n, 1 << 16, [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i) buf[i] = float(i & 7) * 0.125f;
  });
  const KernelTable& k = kernels();
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::atomic<double> sink{0};  // keeps the reads observable
    const auto t0 = clk::now();
    ThreadPool::global().parallel_for(n, 1 << 16, [&](size_t a, size_t b) {
      double s = 0;
      for (size_t i = a; i < b; i += 1 << 16) s += k.dot(&buf[i], &buf[i], int(std::min<size_t>(1 << 16, b - i)));
      sink.fetch_add(s);
    });
    const double dt = std::chrono::duration<double>(clk::now() - t0).count();
    best = std::max(best, double(n) * sizeof(float) / dt / 1e9);
  }
  return best;
}

double measure_fma_gflops() {
  using clk = std::chrono::steady_clock;
  const KernelTable& k = kernels();
  const size_t items = 32 * size_t(ThreadPool::global().size());  // small items: every thread busy to the end
  constexpr long kIters = 2'000'000;  // ~3 ms an item at 2 vector FMAs a cycle
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::atomic<double> flops{0}, sink{0};
    const auto t0 = clk::now();
    ThreadPool::global().parallel_for(items, 1, [&](size_t a, size_t b) {
      for (size_t i = a; i < b; ++i) {
        float s = 0;
        flops.fetch_add(k.fma_flops(kIters, &s));
        sink.fetch_add(s);
      }
    });
    const double dt = std::chrono::duration<double>(clk::now() - t0).count();
    best = std::max(best, flops.load() / dt / 1e9);
  }
  return best;
}

}  // namespace lily::cpu::fast
