// MADV_HUGEPAGE over the weight mapping and the PMD-mapped byte count (see fast_mmap.h).
#include "backend/cpu/fast_mmap.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <spdlog/spdlog.h>

namespace lily::cpu::fast {
namespace {

void span_of(const QWeight& q, uintptr_t& lo, uintptr_t& hi) {
  if (!q.codes) return;
  const auto add = [&](const void* p, size_t n) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    lo = std::min(lo, a), hi = std::max(hi, a + n);
  };
  add(q.codes, size_t(q.rows) * q.words_per_row() * 4);
  add(q.scales, size_t(q.rows) * q.groups_per_row() * 2);
  add(q.biases, size_t(q.rows) * q.groups_per_row() * 2);
}

}  // namespace

// [a, b): the weights' byte span, 2 MiB aligned inward (empty: a >= b).
void weight_span(const ModelWeights& w, uintptr_t& a, uintptr_t& b) {
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  span_of(w.embed, lo, hi), span_of(w.lm_head, lo, hi);
  for (const auto& L : w.layers) {
    for (const QWeight* q : {&L.gdn.in_proj_qkv, &L.gdn.in_proj_z, &L.gdn.in_proj_b, &L.gdn.in_proj_a, &L.gdn.out_proj,
                             &L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj, &L.moe.router,
                             &L.moe.experts_gate, &L.moe.experts_up, &L.moe.experts_down, &L.moe.shared_gate,
                             &L.moe.shared_up, &L.moe.shared_down, &L.moe.shared_expert_gate})
      span_of(*q, lo, hi);
  }
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  a = (lo + kHuge - 1) & ~(kHuge - 1), b = hi & ~(kHuge - 1);
  if (lo >= hi) a = b = 0;
}

size_t advise_huge_pages(const ModelWeights& w) {
  uintptr_t a, b;
  weight_span(w, a, b);
  if (a >= b) return 0;
#ifdef MADV_HUGEPAGE
  if (::madvise(reinterpret_cast<void*>(a), b - a, MADV_HUGEPAGE) != 0) {
    spdlog::debug("cpu backend: madvise(MADV_HUGEPAGE) over the weights failed: {}", std::strerror(errno));
    return 0;
  }
  return size_t(b - a);
#else
  return 0;
#endif
}

double populate_weights(const ModelWeights& w) {
  uintptr_t a, b;
  weight_span(w, a, b);
  if (a >= b) return -1;
  constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ (older headers lack it)
  const auto t0 = std::chrono::steady_clock::now();
  if (::madvise(reinterpret_cast<void*>(a), b - a, kPopulateRead) != 0) {
    spdlog::debug("cpu backend: madvise(MADV_POPULATE_READ) over the weights failed: {}", std::strerror(errno));
    return -1;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

size_t file_pmd_mapped_bytes() {
  std::ifstream f("/proc/self/smaps_rollup");
  const std::string key = "FilePmdMapped:";
  for (std::string line; std::getline(f, line);)
    if (line.compare(0, key.size(), key) == 0) return size_t(std::strtoull(line.c_str() + key.size(), nullptr, 10)) * 1024;
  return 0;
}

}  // namespace lily::cpu::fast
