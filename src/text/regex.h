// A compiled PCRE2 pattern (UTF + UCP, JIT) used for pre-tokenizer splits. HF runs these
// patterns with Oniguruma; PCRE2 agrees once \s/\S are spelled out as Unicode White_Space
// (compile() does that). Thread-safe: per-thread match data and JIT stack.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

namespace lily {

class Regex {
 public:
  // literal=true matches `pattern` as plain text (HF's {"String": ...} split pattern).
  static Result<std::unique_ptr<Regex>> compile(const std::string& pattern, bool literal);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(start, end) for each non-overlapping match of s (valid UTF-8), left to right.
  // After an empty match the search resumes one character later. Returns false if PCRE2
  // gave up (resource limit); matches reported so far stand.
  template <typename Fn>
  bool for_each_match(std::string_view s, Fn&& fn) const {
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t ms, me;
      int rc = match_at(s, pos, ms, me);
      if (rc == 0) return true;
      if (rc < 0) return false;
      fn(ms, me);
      if (me > ms) {
        pos = me;
      } else {
        if (me >= s.size()) return true;
        pos = me + 1;
        while (pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
    return true;
  }

 private:
  Regex() = default;
  // 1 and [ms, me) on a match, 0 on no match, -1 on error.
  int match_at(std::string_view s, size_t pos, size_t& ms, size_t& me) const;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace lily
