// ByteLevel alphabet tables, built once.
#include "text/byte_level.h"

#include "text/utf8.h"

namespace lily::byte_level {
namespace {

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code points < 324 cover the whole alphabet
  Tables() {
    to_byte.fill(-1);
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? static_cast<uint32_t>(b) : 256 + extra++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

uint32_t byte_to_cp(uint8_t b) { return tables().to_cp[b]; }

std::optional<uint8_t> cp_to_byte(uint32_t cp) {
  if (cp >= 324) return std::nullopt;
  int16_t b = tables().to_byte[cp];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

std::optional<std::string> decode(std::string_view s) {
  if (!utf8::is_valid(s)) return std::nullopt;
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto b = cp_to_byte(utf8::next_cp(s, i));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

}  // namespace lily::byte_level
