// The tokenizer's vocabulary arranged for token masks: every token's bytes in a byte trie laid
// out in preorder (a walk skips a rejected prefix's whole subtree with one jump), and, built on
// first use and shared by every request, per-token tables for the inside of a string: where most
// of the vocabulary is allowed, a walk would visit the whole trie, so instead each token's effect
// on a string body (stays inside: how many code points; or ends it: where, and what follows) is
// read from a table and the mask is a few bitset operations. One index per tokenizer and model.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "structured/grammar.h"
#include "text/tokenizer.h"

namespace lily::structured {

// A string body's effect per token, from one body state (a JSON string at a character boundary,
// or raw text at one automaton state).
struct TextTable {
  static constexpr int kCum = 16;     // cumulative bitsets for counts 0..kCum
  std::vector<uint8_t> cls;            // [vocab] 0: not allowed, 1: stays inside, 2: ends the text
  std::vector<int16_t> count;          // cls 1: code points added (raw: minus a partial terminator at the end);
                                       // cls 2: code points of content before the end (raw: may be negative)
  std::vector<uint8_t> pend;           // cls 1: bytes still due for a character begun (UTF-8, escape)
  std::vector<uint8_t> tdepth;         // cls 1, raw: partial terminator at the end
  std::vector<uint32_t> suffix;        // cls 2: id of the bytes after the end
  std::vector<std::string> suffixes;   // distinct suffixes
  std::vector<uint64_t> inside;        // bitset of cls 1
  std::vector<std::vector<uint64_t>> cum;  // [k]: cls 1 with count <= k
  std::vector<int32_t> long_inside;    // cls 1 with count > kCum, by count descending
  std::vector<int32_t> ends;           // cls 2 tokens
  std::vector<int32_t> partial;        // raw cls 1 ending inside a partial terminator
  int max_count = 0;                   // largest cls-1 count
};

class VocabIndex {
 public:
  // n_vocab: the model's vocabulary (logit rows); ids the tokenizer does not know are never allowed.
  VocabIndex(const Tokenizer& tok, int n_vocab);
  // A vocabulary given as bytes per id ("" : no such token), all of them plain (tests, benches).
  explicit VocabIndex(const std::vector<std::string>& tokens);

  int n_vocab() const { return n_vocab_; }
  size_t words() const { return size_t(n_vocab_ + 63) / 64; }
  std::string_view bytes(int32_t id) const {
    return std::string_view(bytes_).substr(off_[size_t(id)], off_[size_t(id) + 1] - off_[size_t(id)]);
  }
  // Tokens a grammar may use by default: known, not special, not an added token (<think>, ...).
  const std::vector<uint64_t>& plain() const { return plain_; }
  bool in_trie(int32_t id) const { return in_trie_[size_t(id)] != 0; }

  // Preorder trie: node i has byte byte_[i] at depth depth_[i] (1-based); its subtree ends at
  // skip_[i]; token_[i] is the token whose bytes end there (-1: none; more in dup_).
  size_t trie_size() const { return byte_.size(); }
  const std::vector<uint8_t>& trie_byte() const { return byte_; }
  const std::vector<uint8_t>& trie_depth() const { return depth_; }
  const std::vector<uint32_t>& trie_skip() const { return skip_; }
  const std::vector<int32_t>& trie_token() const { return token_; }
  int32_t dup_next(int32_t id) const { return dup_[size_t(id)]; }  // another token with the same bytes
  int max_depth() const { return max_depth_; }

  // The table for a JSON string body at a character boundary (raw == nullptr) or for raw text at
  // automaton state `state`. Built on first use (a few ms), then shared; thread-safe.
  const TextTable& text_table(const RawAutomaton* raw, uint32_t state) const;

 private:
  void build_table(TextTable& t, const RawAutomaton* raw, uint32_t state) const;
  void build_trie();
  int n_vocab_;
  std::string bytes_;
  std::vector<uint32_t> off_;
  std::vector<uint8_t> in_trie_;
  std::vector<uint64_t> plain_;
  std::vector<uint8_t> byte_, depth_;
  std::vector<uint32_t> skip_;
  std::vector<int32_t> token_, dup_;
  int max_depth_ = 0;
  mutable std::mutex mu_;
  mutable std::map<std::pair<const RawAutomaton*, uint32_t>, std::unique_ptr<TextTable>> tables_;
};

}  // namespace lily::structured
