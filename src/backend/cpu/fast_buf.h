// A grow-only, 64-byte-aligned scratch buffer: the per-thread (thread_local) workspaces of the prefill
// GEMMs, allocated on first use and when a larger job comes, so that the steady state never allocates.
#pragma once
#include <cstddef>
#include <cstdlib>

namespace lily::cpu::fast {

template <class T>
struct AlignedBuf {
  T* p = nullptr;
  size_t n = 0;
  AlignedBuf() = default;
  AlignedBuf(const AlignedBuf&) = delete;
  AlignedBuf& operator=(const AlignedBuf&) = delete;
  ~AlignedBuf() { std::free(p); }
  // At least want elements; what it held is not kept when it grows.
  T* get(size_t want) {
    if (want > n) {
      std::free(p);
      n = want;
      p = static_cast<T*>(std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64));
    }
    return p;
  }
};

}  // namespace lily::cpu::fast
