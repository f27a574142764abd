// Page-cache friendly use of the mmap'd weights (issue 9 item 2): ask the kernel for 2 MiB folios
// and PMD mappings over the weight tensors (MADV_HUGEPAGE; file-backed, so no second copy), and
// report how much of the mapping ended up PMD-mapped. The routed experts are read at random: with
// 4 KiB pages every 512 KiB expert slice costs 128 TLB misses and page walks on cold page tables.
#pragma once
#include <cstddef>

#include "model/weights.h"

namespace lily::cpu::fast {

// madvise(MADV_HUGEPAGE) over [lowest, highest) byte of the quantized weights, 2 MiB aligned inward.
// Takes effect for pages read into the page cache afterwards (ext4 and other large-folio
// filesystems). Returns the bytes advised (0: refused).
size_t advise_huge_pages(const ModelWeights& w);

// Reads the same range into memory now (madvise(MADV_POPULATE_READ), Linux 5.14+), as llama.cpp's load
// does: the first requests do not wait on the disk, and pages the cache did not hold arrive as 2 MiB
// folios through the advised mapping. Returns the seconds it took, or -1 if the kernel refused.
double populate_weights(const ModelWeights& w);

// FilePmdMapped of this process (/proc/self/smaps_rollup), bytes; 0 if unreadable.
size_t file_pmd_mapped_bytes();

}  // namespace lily::cpu::fast
