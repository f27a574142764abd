// PrefixCache: see prefix_cache.h.
#include "engine/prefix_cache.h"

#include <algorithm>

namespace lily {

PrefixCache::PrefixCache(int max_entries, size_t budget_bytes)
    : max_entries_(std::max(1, max_entries)), budget_(budget_bytes) {}

size_t PrefixCache::bytes() const {
  size_t b = 0;
  for (const auto& e : entries_) b += e.state->bytes();
  return b;
}

bool PrefixCache::fits(size_t bytes) const {
  return int(entries_.size()) < max_entries_ && this->bytes() + bytes <= budget_;
}

int PrefixCache::best_for(const std::vector<int32_t>& prompt, const std::string& key) const {
  int best = -1;
  auto better = [&](const CacheEntry& a, const CacheEntry& b) {
    bool ka = !key.empty() && a.key == key, kb = !key.empty() && b.key == key;
    if (ka != kb) return ka;
    return a.tokens.size() > b.tokens.size();
  };
  for (int i = 0; i < int(entries_.size()); ++i) {
    const auto& t = entries_[i].tokens;
    if (t.empty() || t.size() >= prompt.size()) continue;
    if (!std::equal(t.begin(), t.end(), prompt.begin())) continue;
    if (best < 0 || better(entries_[i], entries_[best])) best = i;
  }
  return best;
}

const CacheEntry* PrefixCache::peek(const std::vector<int32_t>& prompt, const std::string& key) const {
  const int best = best_for(prompt, key);
  return best < 0 ? nullptr : &entries_[size_t(best)];
}

std::optional<CacheEntry> PrefixCache::take(const std::vector<int32_t>& prompt, const std::string& key) {
  const int best = best_for(prompt, key);
  if (best < 0) return std::nullopt;
  if (entries_[best].shared) {
    CacheEntry& src = entries_[best];
    src.last_used = ++clock_;
    if (auto copy = src.state->clone()) {
      CacheEntry e;
      e.tokens = src.tokens;
      e.state = std::move(copy);
      e.key = src.key;
      return e;
    }
  }
  CacheEntry e = std::move(entries_[best]);
  e.shared = false;
  entries_.erase(entries_.begin() + best);
  return e;
}

bool PrefixCache::holds(const std::vector<int32_t>& tokens) const {
  for (const auto& e : entries_)
    if (e.tokens == tokens) return true;
  return false;
}

std::optional<CacheEntry> PrefixCache::take_lru(std::span<const uint64_t> keep) {
  auto it = entries_.end();
  for (auto i = entries_.begin(); i != entries_.end(); ++i)
    if (std::find(keep.begin(), keep.end(), i->id) == keep.end() && (it == entries_.end() || i->last_used < it->last_used))
      it = i;
  if (it == entries_.end()) return std::nullopt;
  CacheEntry e = std::move(*it);
  entries_.erase(it);
  return e;
}

std::vector<std::unique_ptr<SeqState>> PrefixCache::put(CacheEntry e) {
  std::vector<std::unique_ptr<SeqState>> out;
  e.last_used = ++clock_;
  e.id = ++next_id_;
  if (!e.tokens.empty()) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->tokens == e.tokens) out.push_back(std::move(it->state)), it = entries_.erase(it);
      else ++it;
    }
  }
  const size_t b = e.state->bytes();
  while (!entries_.empty() && (int(entries_.size()) + 1 > max_entries_ || bytes() + b > budget_))
    out.push_back(std::move(take_lru()->state));
  entries_.push_back(std::move(e));
  return out;
}

}  // namespace lily
