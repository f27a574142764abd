// Prefix cache of model states. A follow-up turn whose prompt extends an earlier sequence's
// tokens continues from that sequence's state (DeltaNet state, conv window and KV cache) and
// prefills only the new suffix. The match must be a strict prefix: the state holds no logits,
// so at least one prompt token has to be fed. Entries are evicted least recently used, within
// a count and a memory budget. Used from the engine thread only.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace lily {

struct CacheEntry {
  std::vector<int32_t> tokens;  // exactly what the state has consumed
  std::unique_ptr<SeqState> state;
  std::string key;              // prompt_cache_key of the request that made it ("" if none)
  bool shared = false;          // a branch point (shared head): take() hands out copies
  uint64_t last_used = 0;
  uint64_t id = 0;              // set by PrefixCache::put, unique while cached
};

class PrefixCache {
 public:
  PrefixCache(int max_entries, size_t budget_bytes);

  // Removes and returns the best entry for `prompt`: among entries whose tokens are a strict
  // prefix of it, one with the same key wins, then the longest. A shared entry stays cached and
  // a copy of its state is returned instead (moved out only if the copy cannot be made).
  std::optional<CacheEntry> take(const std::vector<int32_t>& prompt, const std::string& key);
  // The entry take() would pick for this prompt, left where it is (nullptr: none; valid until the
  // cache changes).
  const CacheEntry* peek(const std::vector<int32_t>& prompt, const std::string& key) const;
  // Whether an entry holds exactly these tokens.
  bool holds(const std::vector<int32_t>& tokens) const;
  // Removes and returns the least recently used entry whose id is not in `keep` (to recycle its
  // allocation).
  std::optional<CacheEntry> take_lru(std::span<const uint64_t> keep = {});
  // Stores an entry, evicting the least recently used ones over the limits (the new entry is
  // always kept). An entry with the same (non-empty) tokens is replaced. The states evicted or
  // replaced are returned (their allocations can be reused; dropping them frees them).
  std::vector<std::unique_ptr<SeqState>> put(CacheEntry e);
  // Whether a new allocation of `bytes` fits beside the cached entries.
  bool fits(size_t bytes) const;

  int size() const { return int(entries_.size()); }
  size_t bytes() const;

 private:
  int best_for(const std::vector<int32_t>& prompt, const std::string& key) const;  // take()'s pick, or -1
  int max_entries_;
  size_t budget_;
  uint64_t clock_ = 0, next_id_ = 0;
  std::vector<CacheEntry> entries_;
};

}  // namespace lily
