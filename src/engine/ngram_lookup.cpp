// NgramLookup: see ngram_lookup.h.
#include "engine/ngram_lookup.h"

#include <algorithm>

namespace lily {
namespace {

// Hash of the n tokens h[e - n, e).
uint64_t ngram_key(std::span<const int32_t> h, size_t e, int n) {
  uint64_t k = 0x9e3779b97f4a7c15ull * uint64_t(n);
  for (size_t i = e - size_t(n); i < e; ++i) k = (k ^ uint32_t(h[i])) * 0x100000001b3ull + (k >> 29);
  return k;
}

}  // namespace

std::vector<int32_t> NgramLookup::draft(std::span<const int32_t> h, int32_t next, int max_len, int max_ngram) {
  std::vector<int32_t> out;
  if (max_len <= 0 || max_ngram < 2) return out;
  if (at_.size() != size_t(max_ngram + 1) || indexed_ > h.size()) at_.assign(size_t(max_ngram + 1), {}), indexed_ = 0;
  // The history H = h ++ [next], L tokens. Every n-gram of h is indexed (each ends at e <= |h|, so a
  // token of H follows it); H's suffix, which ends with next, is looked up, never indexed.
  for (size_t e = std::max<size_t>(indexed_ + 1, 2); e <= h.size(); ++e)
    for (int n = 2; n <= max_ngram && size_t(n) <= e; ++n) at_[size_t(n)][ngram_key(h, e, n)] = int(e);
  indexed_ = h.size();
  const size_t L = h.size() + 1;
  auto at = [&](size_t i) { return i < h.size() ? h[i] : next; };
  std::vector<int32_t> suffix;
  for (int n = std::min<int>(max_ngram, int(L) - 1); n >= 2; --n) {
    suffix.clear();
    for (size_t i = L - size_t(n); i < L; ++i) suffix.push_back(at(i));
    auto it = at_[size_t(n)].find(ngram_key(suffix, suffix.size(), n));
    if (it == at_[size_t(n)].end()) continue;
    const size_t e = size_t(it->second);
    bool same = true;  // a hash collision is no match
    for (int i = 0; i < n && same; ++i) same = h[e - size_t(n) + size_t(i)] == suffix[size_t(i)];
    if (!same) continue;
    for (size_t i = e; out.size() < size_t(max_len); ++i) out.push_back(i < L ? at(i) : out[i - L]);
    return out;
  }
  return out;
}

}  // namespace lily
