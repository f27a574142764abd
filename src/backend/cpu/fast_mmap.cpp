// MADV_HUGEPAGE, populate and small-folio re-read over the weights' file mappings, and the PMD-mapped
// byte count (see fast_mmap.h).
#include "backend/cpu/fast_mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

namespace lily::cpu::fast {
namespace {

constexpr uintptr_t kHuge = uintptr_t(2) << 20;
constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ (Linux 5.14+; older headers lack it)

// One line of /proc/self/maps.
struct Vma {
  uintptr_t lo = 0, hi = 0;
  size_t off = 0;
  bool file = false;  // backed by a file (a path, not [heap], [stack] or anonymous)
  std::string path;
};

std::vector<Vma> read_maps() {
  std::vector<Vma> out;
  std::ifstream f("/proc/self/maps");
  for (std::string line; std::getline(f, line);) {
    unsigned long lo = 0, hi = 0, off = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx %7s %lx %*s %*s %n", &lo, &hi, perms, &off, &path_at) < 4) continue;
    Vma v;
    v.lo = lo, v.hi = hi, v.off = off;
    if (path_at > 0 && size_t(path_at) < line.size() && line[size_t(path_at)] == '/') v.file = true, v.path = line.substr(size_t(path_at));
    out.push_back(std::move(v));
  }
  return out;  // in address order, as the kernel lists them
}

// The weights' regions: for each file mapping that holds weight tensors, the span of those tensors in it,
// 2 MiB aligned inward. Only these ranges are ever advised, populated or dropped: a sharded checkpoint is
// several mappings with other memory between them, and weights built in memory (synthetic, tests) are
// anonymous and left alone.
}  // namespace

std::vector<WeightRegion> weight_regions(const ModelWeights& w) {
  const std::vector<Vma> maps = read_maps();
  std::map<size_t, std::pair<uintptr_t, uintptr_t>> ext;  // vma index -> [lo, hi) of tensor bytes
  const auto add = [&](const void* p, size_t n) {
    if (!p || n == 0) return;
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = std::upper_bound(maps.begin(), maps.end(), a, [](uintptr_t x, const Vma& v) { return x < v.lo; });
    if (it == maps.begin()) return;
    --it;
    if (a >= it->hi || !it->file) return;
    const size_t i = size_t(it - maps.begin());
    auto [e, fresh] = ext.try_emplace(i, a, std::min(a + n, it->hi));
    if (!fresh) e->second.first = std::min(e->second.first, a), e->second.second = std::max(e->second.second, std::min(a + n, it->hi));
  };
  const auto add_q = [&](const QWeight& q) {
    if (!q.codes) return;
    add(q.codes, size_t(q.rows) * q.words_per_row() * 4);
    add(q.scales, size_t(q.rows) * q.groups_per_row() * 2);
    add(q.biases, size_t(q.rows) * q.groups_per_row() * 2);
  };
  add_q(w.embed), add_q(w.lm_head);
  for (const auto& L : w.layers)
    for (const QWeight* q : {&L.gdn.in_proj_qkv, &L.gdn.in_proj_z, &L.gdn.in_proj_b, &L.gdn.in_proj_a, &L.gdn.out_proj,
                             &L.attn.q_proj, &L.attn.k_proj, &L.attn.v_proj, &L.attn.o_proj, &L.moe.router,
                             &L.moe.experts_gate, &L.moe.experts_up, &L.moe.experts_down, &L.moe.shared_gate,
                             &L.moe.shared_up, &L.moe.shared_down, &L.moe.shared_expert_gate})
      add_q(*q);
  std::vector<WeightRegion> out;
  for (const auto& [i, e] : ext) {
    const Vma& v = maps[i];
    WeightRegion r;
    r.a = (e.first + kHuge - 1) & ~(kHuge - 1), r.b = e.second & ~(kHuge - 1);
    if (r.a >= r.b) continue;
    r.file_offset = v.off + size_t(r.a - v.lo), r.path = v.path;
    out.push_back(std::move(r));
  }
  return out;
}

size_t advise_huge_pages(const std::vector<WeightRegion>& regions) {
  size_t n = 0;
#ifdef MADV_HUGEPAGE
  for (const WeightRegion& r : regions) {
    if (::madvise(reinterpret_cast<void*>(r.a), r.b - r.a, MADV_HUGEPAGE) != 0) {
      spdlog::debug("cpu backend: madvise(MADV_HUGEPAGE) over {} failed: {}", r.path, std::strerror(errno));
      continue;
    }
    n += r.b - r.a;
  }
#else
  (void)regions;
#endif
  return n;
}

double populate_weights(const std::vector<WeightRegion>& regions) {
  if (regions.empty()) return -1;
  const auto t0 = std::chrono::steady_clock::now();
  for (const WeightRegion& r : regions)
    if (::madvise(reinterpret_cast<void*>(r.a), r.b - r.a, kPopulateRead) != 0) {
      spdlog::debug("cpu backend: madvise(MADV_POPULATE_READ) over {} failed: {}", r.path, std::strerror(errno));
      return -1;
    }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

RefaultResult refault_small_folios(const std::vector<WeightRegion>& regions) {
  RefaultResult r;
  size_t total = 0;
  for (const WeightRegion& g : regions) total += g.b - g.a;
  if (total == 0) return r;
  r.pmd_before = r.pmd_after = file_pmd_mapped_bytes();
  if (r.pmd_before >= total / 10 * 9) return r;  // (nearly) all in 2 MiB folios already
  const auto t0 = std::chrono::steady_clock::now();
  // Drop [p, p + n) of region g from this mapping and from the page cache (clean pages no other process
  // maps); fill: fault it back through the MADV_HUGEPAGE mapping. False if the kernel refused.
  const auto drop = [](int fd, const WeightRegion& g, uintptr_t p, size_t n) {
    return ::madvise(reinterpret_cast<void*>(p), n, MADV_DONTNEED) == 0 &&
           ::posix_fadvise(fd, off_t(g.file_offset + (p - g.a)), off_t(n), POSIX_FADV_DONTNEED) == 0;
  };
  const auto fill = [](uintptr_t p, size_t n) { return ::madvise(reinterpret_cast<void*>(p), n, kPopulateRead) == 0; };
  for (size_t i = 0; i < regions.size(); ++i) {
    const WeightRegion& g = regions[i];
    const int fd = ::open(g.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
    size_t done = 0;
    if (i == 0) {
      // A 64 MiB probe first: where the file system (or a file another process maps) gives small folios
      // again, re-reading 19 GB would cost seconds for nothing. Its gain counts from after its eviction.
      const size_t probe = std::min(g.b - g.a, size_t(64) << 20);
      const bool dropped = drop(fd, g, g.a, probe);
      const size_t evicted = file_pmd_mapped_bytes();
      if (!dropped || !fill(g.a, probe) || file_pmd_mapped_bytes() < evicted + probe / 2) {
        ::close(fd);
        return r;
      }
      r.tried = true, done = probe;
    }
    const size_t n = g.b - g.a - done;
    const bool ok = n == 0 || (drop(fd, g, g.a + done, n) && fill(g.a + done, n));
    ::close(fd);
    if (!ok) {
      spdlog::debug("cpu backend: re-faulting {} stopped: {}", g.path, std::strerror(errno));
      break;
    }
  }
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
