// Prompt lookup (speculative decoding's drafts, EngineOptions::spec_draft): the tokens that followed
// the latest earlier occurrence of a sequence's last n tokens, n = max_ngram down to 2. The history is
// the tokens fed so far and the pending one that comes next; an index of every n-gram of the fed
// tokens, extended as they grow, makes a lookup O(max_ngram) however long the context.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace lily {

class NgramLookup {
 public:
  // fed: the tokens fed so far (only ever extended between calls; a shorter one starts the index
  // over), next: the token that follows them. At most max_len tokens; past the end of the history,
  // the drafts continue with themselves (a repeating stretch repeats). Empty when no n-gram of
  // length 2..max_ngram ending with `next` occurred before.
  std::vector<int32_t> draft(std::span<const int32_t> fed, int32_t next, int max_len, int max_ngram);

 private:
  // For n = 2..max_ngram: hash of the n-gram ending before position e -> the latest such e, for
  // every e <= indexed_.
  std::vector<std::unordered_map<uint64_t, int>> at_;
  size_t indexed_ = 0;
};

}  // namespace lily
