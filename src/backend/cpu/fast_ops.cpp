// Instruction-set choice and the job scheduler of the fast CPU kernels (see fast_ops.h).
#include "backend/cpu/fast_ops.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "core/thread_pool.h"

namespace lily::cpu::fast {
namespace {

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}
bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2");
}

const KernelTable* table_by_name(const std::string& n) {
  if (n == "avx512" && cpu_has_avx512()) return avx512_table();
  if (n == "avx2" && cpu_has_avx2()) return avx2_table();
  if (n == "scalar") return &scalar_table();
  if (n == "scalar-f32") return &scalar_f32_table();
  return nullptr;
}

const KernelTable*& current() {
  static const KernelTable* t = [] {
    const auto avail = available_isas();
    if (const char* e = std::getenv("LILY_CPU_ISA"); e && *e) {
      if (const KernelTable* k = table_by_name(e)) return k;
      spdlog::warn("LILY_CPU_ISA={} is not available on this CPU; using {}", e, avail.front());
    }
    return table_by_name(avail.front());
  }();
  return t;
}

}  // namespace

std::vector<std::string> available_isas() {
  std::vector<std::string> v;
  if (cpu_has_avx512()) v.push_back("avx512");
  if (cpu_has_avx2()) v.push_back("avx2");
  v.push_back("scalar");
  return v;
}

bool select_isa(const std::string& name) {
  const KernelTable* k = table_by_name(name);
  if (!k) return false;
  current() = k;
  return true;
}

const KernelTable& kernels() { return *current(); }

void parallel_dynamic(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  ThreadPool& pool = ThreadPool::global();
  const int nt = std::min(pool.size(), n);
  if (nt <= 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int> next{0};
  pool.parallel_for(size_t(nt), 1, [&](size_t, size_t) {
    for (int i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  });
}

void run_qjobs(std::span<const QJob> jobs) {
  // Work is handed out as groups of pieces (job, rows [r0, r1)), one group a pool item.
  struct Piece {
    int job, r0, r1;
  };
  std::vector<std::vector<Piece>> groups;
  // Matvec jobs of few tokens (decode): their rows, all jobs together, cut into groups of equal cost
  // (codes bytes × tokens), a multiple of the threads in number and ~512 KiB of codes each at one token:
  // long sequential streams for the prefetchers (each group ramps up from cold; the full checkpoint's
  // decode went 10.1 → 10.9 tok/s from 128 KiB pieces at 2 threads, docs/perf/2026-12-06-cpu-decode.md),
  // and no thread left with an extra piece. One piece a job before: a decode step's expert down_proj
  // list (8 experts + the shared one, 0.59 MB each) split 5 : 4 over 2 threads, the router and shared
  // expert list 1.06 : 0.56 MB (36.7 GB/s where the balanced lists reached 43-45). Cuts fall on rows
  // ≡ 0 (mod 4) of a job, so every row keeps the 4-row register block it had: the same sums.
  std::vector<int> few;
  double few_cost = 0;
  auto cost_of = [&](const QJob& jb, int rows) { return double(rows) * jb.w->words_per_row() * 4.0 * jb.n; };
  for (int j = 0; j < int(jobs.size()); ++j) {
    const QJob& jb = jobs[j];
    if (jb.n == 0) continue;
    const int rows = jb.w->rows;
    const int row_bytes = std::max(1, jb.w->words_per_row() * 4);
    // The fp32 GEMM (no PreparedX) dequantizes 32-row panels once per task: tasks of 32 rows.
    const bool gemm = jb.w->bits == 4 && jb.x == nullptr;
    if (!gemm && jb.n < 16) {
      few.push_back(j), few_cost += cost_of(jb, rows);
      continue;
    }
    // Jobs of ≤ 32 tokens (the routed experts) stream their weights faster in long tasks: ~256 KiB
    // of codes each, whole 32-row panels. Two threads on adjacent 8 KiB tasks of one expert's
    // down_proj reached 57-70 GMAC/s, on 256 KiB tasks 94-126 (8 tokens). 64 rows at M ≥ 16, whose
    // codes stay cached across token blocks.
    constexpr int task_kb = 256;
    const int few_rows = std::max(32, ((task_kb << 10) / row_bytes) & ~31);
    const int block = gemm ? (jb.n <= 32 ? few_rows : 32) : 64;
    for (int r = 0; r < rows; r += block) groups.push_back({{j, r, std::min(rows, r + block)}});
  }
  if (!few.empty()) {
    const int threads = std::max(1, ThreadPool::global().size());
    const double unit = double(512 << 10);  // cost of ~512 KiB of codes at one token
    const int n_groups = threads * std::max(1, int(std::ceil(few_cost / (threads * unit))));
    const double target = few_cost / n_groups;
    std::vector<Piece> g;
    double in_group = 0;
    for (int j : few) {
      const QJob& jb = jobs[j];
      const int rows = jb.w->rows;
      const double per_row = cost_of(jb, 1);
      int r = 0;
      while (r < rows) {
        // Rows that fill the group (rounded up to a multiple of 4 from the job's first row), or the rest.
        int take = int(std::ceil((target - in_group) / per_row));
        int r1 = std::min(rows, (r + std::max(take, 1) + 3) & ~3);
        g.push_back({j, r, r1});
        in_group += per_row * (r1 - r);
        r = r1;
        if (in_group >= target * 0.999) {
          groups.push_back(std::move(g));
          g.clear();
          in_group = 0;
        }
      }
    }
    if (!g.empty()) groups.push_back(std::move(g));
  }
  const KernelTable& k = kernels();
  parallel_dynamic(int(groups.size()), [&](int t) {
    for (const Piece& pc : groups[size_t(t)]) {
      const QJob& jb = jobs[size_t(pc.job)];
      QArgs a;
      static_cast<QJob&>(a) = jb;
      a.r0 = pc.r0, a.r1 = pc.r1;
      if (jb.w->bits == 8)
        k.q8_rows(a);
      else if (jb.x == nullptr)
        k.q4_gemm(a);
      else
        k.q4_rows(a);
    }
  });
}

}  // namespace lily::cpu::fast
