// UTF-8 helpers shared by the tokenizer and the stream decoder: validation, code point
// iteration, and lossy repair that replaces each maximal invalid subpart with U+FFFD, the
// same rule as Rust's String::from_utf8_lossy (which HF's decoders use) and WHATWG's decoder.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lily::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Result of looking at the bytes that start at one position.
struct Scan {
  enum Kind { kValid, kInvalid, kIncomplete } kind;
  // kValid: length of the well-formed character (1..4), cp its code point.
  // kInvalid: length of the maximal invalid subpart (>= 1) to replace with one U+FFFD.
  // kIncomplete: the rest of the input is a valid prefix of a character (needs more bytes).
  size_t len;
  uint32_t cp;
};

// Classifies the character starting at s[0]; n > 0 bytes are available.
Scan scan(const unsigned char* s, size_t n);

// True if the whole string is well-formed UTF-8.
bool is_valid(std::string_view s);

// Appends the lossy repair of s to out: valid characters copied, each maximal invalid subpart
// (including a truncated character at the end) replaced with U+FFFD.
void append_lossy(std::string_view s, std::string& out);
std::string to_valid_lossy(std::string_view s);

// Length of the longest prefix of s that can be emitted now without changing the lossy result
// of s + (any later bytes): everything except a trailing incomplete-but-valid prefix.
size_t stable_prefix_len(std::string_view s);

// Appends the UTF-8 encoding of cp (cp must be a Unicode scalar value).
void append_cp(uint32_t cp, std::string& out);

// Decodes the (valid) character at s[i], advancing i. Input must be valid UTF-8.
inline uint32_t next_cp(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  unsigned char c = p[0];
  if (c < 0x80) { i += 1; return c; }
  if (c < 0xE0) { i += 2; return ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu); }
  if (c < 0xF0) { i += 3; return ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu); }
  i += 4;
  return ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

}  // namespace lily::utf8
