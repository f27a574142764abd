// Added-token matching. Few tokens share a first byte ('<' for all of Qwen's), so a byte table
// plus a longest-first scan of the candidates is as fast as an automaton here.
#include "text/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "text/unicode.h"
#include "text/utf8.h"

namespace lily {

void AddedTokenMatcher::build(const std::vector<const AddedToken*>& tokens, const std::vector<std::string>& patterns) {
  entries_.clear();
  first_byte_.fill(false);
  by_byte_.fill({0, 0});
  for (size_t i = 0; i < tokens.size(); ++i)
    if (!patterns[i].empty()) entries_.push_back({patterns[i], tokens[i]});
  // Stable: among equal patterns the first given wins, like the automaton's pattern order.
  std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    auto fa = static_cast<unsigned char>(a.pattern[0]), fb = static_cast<unsigned char>(b.pattern[0]);
    if (fa != fb) return fa < fb;
    return a.pattern.size() > b.pattern.size();
  });
  for (uint32_t i = 0; i < entries_.size(); ++i) {
    auto b = static_cast<unsigned char>(entries_[i].pattern[0]);
    if (!first_byte_[b]) by_byte_[b].first = i;
    first_byte_[b] = true;
    by_byte_[b].second = i + 1;
  }
}

int AddedTokenMatcher::find(std::string_view s, size_t pos, size_t& at) const {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = pos; i < s.size(); ++i) {
    if (!first_byte_[p[i]]) continue;
    auto [b, e] = by_byte_[p[i]];
    for (uint32_t k = b; k < e; ++k) {
      const std::string& pat = entries_[k].pattern;
      if (pat.size() <= s.size() - i && std::memcmp(s.data() + i, pat.data(), pat.size()) == 0) {
        at = i;
        return static_cast<int>(k);
      }
    }
  }
  return -1;
}

namespace {

uint32_t last_cp(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  size_t j = i;
  return utf8::next_cp(s, j);
}

// Start of the trailing run of White_Space characters of s (s.size() if none).
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    size_t j = i;
    if (!unicode::is_white_space(utf8::next_cp(s, j))) break;
    end = i;
  }
  return end;
}

// Length of the leading run of White_Space characters of s.
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!unicode::is_white_space(utf8::next_cp(s, j))) break;
    i = j;
  }
  return i;
}

}  // namespace

void AddedTokenMatcher::split(std::string_view s, std::vector<Split>& out) const {
  size_t start_offset = 0;
  size_t pos = 0, at = 0;
  while (pos < s.size()) {
    int k = find(s, pos, at);
    if (k < 0) break;
    const Entry& en = entries_[k];
    size_t start = at, stop = at + en.pattern.size();
    pos = stop;  // the automaton resumes after the raw match, whatever the flags do
    const AddedToken& t = *en.token;
    if (t.single_word) {
      bool start_space = start == 0 || !unicode::is_word_char(last_cp(s.substr(0, start)));
      size_t j = stop;
      bool stop_space = stop == s.size() || !unicode::is_word_char(utf8::next_cp(s, j));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(trailing_space_start(s.substr(0, start)), start_offset);
    if (t.rstrip) stop += leading_space_len(s.substr(stop));
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
}

}  // namespace lily
