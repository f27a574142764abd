// Token masks: which tokens of the vocabulary may come next at a grammar position, such that the
// output can still be completed within a byte budget. compute() is the fast path: a stack whose
// top is inside a string reads the vocabulary's string tables (bitsets by code-point count, then
// the few tokens that end the string are checked against the stack below); any other stack walks
// the token trie, skipping every subtree whose prefix the grammar rejects. reference_mask() is the
// scalar definition (every token fed alone through Position::accepts); tests compare the two.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "structured/matcher.h"
#include "structured/vocab_index.h"

namespace lily::structured {

struct MaskStats {
  uint64_t masks = 0, walks = 0, walk_nodes = 0, table_fast = 0, table_scans = 0;
};

class MaskComputer {
 public:
  explicit MaskComputer(const VocabIndex& vocab) : v_(vocab) {}
  // bits := tokens in `allowed` whose bytes the position accepts and after which the output can
  // still complete within `limit` bytes. bits and allowed have vocab.words() words.
  void compute(const Grammar& g, const Position& pos, int64_t limit, std::span<const uint64_t> allowed,
               std::span<uint64_t> bits);
  const MaskStats& stats() const { return stats_; }

 private:
  // A stack whose top is a string body at a table state: false if it must be walked instead.
  bool text_stack(const Grammar& g, const Position& pos, size_t stack, int64_t limit, std::span<uint64_t> bits);
  void walk(const Grammar& g, const Position& pos, const std::vector<Cursor>& start, int64_t limit,
            std::span<uint64_t> bits);
  const VocabIndex& v_;
  MaskStats stats_;
  std::vector<std::vector<Cursor>> levels_;
  std::vector<uint64_t> tmp_;
  // Per suffix of the string table: the fewest bytes to finish after it, from the frames below the
  // string. Those frames stay the same for the whole string, so the results carry over from one
  // token to the next while they do (memo_below_ / memo_table_).
  std::vector<int64_t> suffix_memo_;
  std::vector<uint32_t> suffix_gen_;
  uint32_t gen_ = 0;
  std::vector<Frame> memo_below_;
  const TextTable* memo_table_ = nullptr;
  const Grammar* memo_grammar_ = nullptr;
  std::vector<Cursor> cur_, nxt_;
};

void reference_mask(const Grammar& g, const Position& pos, const VocabIndex& vocab, int64_t limit,
                    std::span<const uint64_t> allowed, std::span<uint64_t> bits);

inline bool test_bit(std::span<const uint64_t> b, size_t i) { return (b[i / 64] >> (i % 64)) & 1; }
inline void set_bit(std::span<uint64_t> b, size_t i) { b[i / 64] |= uint64_t(1) << (i % 64); }

}  // namespace lily::structured
