// Page-cache friendly use of the mmap'd weights (issue 9 item 2): ask the kernel for 2 MiB folios
// and PMD mappings over the weight tensors (MADV_HUGEPAGE; file-backed, so no second copy), and
// report how much of the mapping ended up PMD-mapped. The routed experts are read at random: with
// 4 KiB pages every 512 KiB expert slice costs 128 TLB misses and page walks on cold page tables.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/weights.h"

namespace lily::cpu::fast {

// The weights' regions: for each file mapping that holds weight tensors (a checkpoint may be several
// shards), the span of its tensors, 2 MiB aligned inward. The calls below touch only these ranges: other
// memory between shard mappings, and weights built in anonymous memory (synthetic, tests), is left alone.
// Compute them once, before advise_huge_pages: the advice splits each mapping at the region's ends, and
// regions found after that lose the 2 MiB pages their edge tensors share with the split-off parts.
struct WeightRegion {
  uintptr_t a = 0, b = 0;  // [a, b), 2 MiB aligned
  size_t file_offset = 0;  // of a in the file
  std::string path;
};
std::vector<WeightRegion> weight_regions(const ModelWeights& w);

// madvise(MADV_HUGEPAGE) over the weight regions. Takes effect for pages read into the page cache
// afterwards (ext4 and other large-folio filesystems). Returns the bytes advised (0: refused).
size_t advise_huge_pages(const std::vector<WeightRegion>& regions);

// Reads the same regions into memory now (madvise(MADV_POPULATE_READ), Linux 5.14+), as llama.cpp's load
// does: the first requests do not wait on the disk, and pages the cache did not hold arrive as 2 MiB
// folios through the advised mapping. Returns the seconds it took, or -1 if the kernel refused.
double populate_weights(const std::vector<WeightRegion>& regions);

// Pages that were in the page cache before lily mapped them stay in the folios they came in, whatever the
// mapping asks: a file just copied (or written) gave 14.5-15.7 of 19.5 GB PMD-mapped, run after run, and
// decode slower by up to ~30% (docs/perf/2026-12-06-cpu-decode.md). After populate_weights: when less than
// 90% of the weight regions' bytes are PMD-mapped, drop them from the mapping and the page cache (MADV_DONTNEED, then
// posix_fadvise(DONTNEED) on the file: clean pages no other process maps) and fault it back through the
// advised mapping, which reads it in 2 MiB folios (15.7 -> 19.5 GB in 7.7 s on the 2-vCPU dev VM). A
// 64 MiB probe first, so where the file system gives small folios again only that much is re-read.
// tried: the regions were re-read.
struct RefaultResult {
  bool tried = false;
  size_t pmd_before = 0, pmd_after = 0;  // FilePmdMapped bytes
  double seconds = 0;
};
RefaultResult refault_small_folios(const std::vector<WeightRegion>& regions);

// FilePmdMapped of this process (/proc/self/smaps_rollup), bytes; 0 if unreadable.
size_t file_pmd_mapped_bytes();

}  // namespace lily::cpu::fast
