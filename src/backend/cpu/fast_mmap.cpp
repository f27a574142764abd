// MADV_HUGEPAGE over the weight mapping and the PMD-mapped byte count (see fast_mmap.h).
#include "backend/cpu/fast_mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>

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

std::string mapped_file(const void* addr, size_t& offset) {
  const auto p = reinterpret_cast<uintptr_t>(addr);
  std::ifstream f("/proc/self/maps");
  for (std::string line; std::getline(f, line);) {
    unsigned long lo = 0, hi = 0, off = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %*s %*s %n", &lo, &hi, perms, &off, &path_at) < 4 || path_at == 0) continue;
    if (p < lo || p >= hi || line[size_t(path_at)] != '/') continue;
    offset = size_t(off) + size_t(p - lo);
    return line.substr(size_t(path_at));
  }
  return {};
}

RefaultResult refault_small_folios(const ModelWeights& w) {
  RefaultResult r;
  uintptr_t a, b;
  weight_span(w, a, b);
  if (a >= b) return r;
  const size_t span = size_t(b - a);
  r.pmd_before = r.pmd_after = file_pmd_mapped_bytes();
  if (r.pmd_before >= span / 10 * 9) return r;  // (nearly) all in 2 MiB folios already
  size_t off0 = 0;
  const std::string path = mapped_file(reinterpret_cast<const void*>(a), off0);
  if (path.empty()) return r;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return r;
  constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ (5.14+)
  const auto t0 = std::chrono::steady_clock::now();
  // Drop [p, p + n) from this mapping and from the page cache (clean pages no other process maps), then
  // fault it back through the MADV_HUGEPAGE mapping. False if the kernel refused a step.
  const auto refault = [&](uintptr_t p, size_t n) {
    return ::madvise(reinterpret_cast<void*>(p), n, MADV_DONTNEED) == 0 &&
           ::posix_fadvise(fd, off_t(off0 + (p - a)), off_t(n), POSIX_FADV_DONTNEED) == 0 &&
           ::madvise(reinterpret_cast<void*>(p), n, kPopulateRead) == 0;
  };
  // A 64 MiB probe first: where the file system (or a file another process maps) gives small folios again,
  // re-reading 19 GB would cost seconds for nothing. Its gain is counted from after its eviction.
  const size_t probe = std::min(span, size_t(64) << 20);
  if (::madvise(reinterpret_cast<void*>(a), probe, MADV_DONTNEED) != 0 ||
      ::posix_fadvise(fd, off_t(off0), off_t(probe), POSIX_FADV_DONTNEED) != 0) {
    ::close(fd);
    return r;
  }
  const size_t evicted = file_pmd_mapped_bytes();
  const bool ok = ::madvise(reinterpret_cast<void*>(a), probe, kPopulateRead) == 0;
  if (ok && file_pmd_mapped_bytes() >= evicted + probe / 2) {
    r.tried = true;
    if (span > probe && !refault(a + probe, span - probe))
      spdlog::debug("cpu backend: re-faulting the weights stopped: {}", std::strerror(errno));
  }
  ::close(fd);
  r.pmd_after = file_pmd_mapped_bytes();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

size_t file_pmd_mapped_bytes() {
  std::ifstream f("/proc/self/smaps_rollup");
  const std::string key = "FilePmdMapped:";
  for (std::string line; std::getline(f, line);)
    if (line.compare(0, key.size(), key) == 0) return size_t(std::strtoull(line.c_str() + key.size(), nullptr, 10)) * 1024;
  return 0;
}

}  // namespace lily::cpu::fast
