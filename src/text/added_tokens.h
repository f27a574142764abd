// Added and special tokens: found in the text before BPE, leftmost first and longest among
// those starting at the same place (HF's Aho-Corasick LeftmostLongest), then widened by the
// token's lstrip/rstrip flags and filtered by single_word, exactly as HF's find_matches.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lily {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// One piece of a split text: [start, end) bytes, with the added token id or -1 for plain text.
struct Split {
  size_t start, end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() { first_byte_.fill(false); }
  // patterns[i] is what to look for (the token content, normalized when the token is), for
  // tokens[i]. Empty patterns are ignored.
  void build(const std::vector<const AddedToken*>& tokens, const std::vector<std::string>& patterns);
  bool empty() const { return entries_.empty(); }

  // Appends the pieces of s: plain text (id -1) and added tokens, in order, none empty. They
  // cover s; as in HF, a token piece widened by rstrip may overlap a following token that
  // starts with whitespace.
  void split(std::string_view s, std::vector<Split>& out) const;

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  // Leftmost-longest match at or after pos: index into entries_, or -1.
  int find(std::string_view s, size_t pos, size_t& at) const;
  std::vector<Entry> entries_;                     // sorted by first byte, then longest first
  std::array<std::pair<uint32_t, uint32_t>, 256> by_byte_{};  // [begin, end) into entries_
  std::array<bool, 256> first_byte_;
};

}  // namespace lily
