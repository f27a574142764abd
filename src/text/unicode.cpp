// NFC quick check: a code point is inert if NFC maps it to itself, its combining class is 0,
// it is not a non-initial element of any canonical decomposition (so it cannot compose with
// what precedes it) and its own decomposition does not start with such a code point. A string
// of inert code points is already NFC. The table covers planes 0-2; beyond, always normalize.
#include "text/unicode.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include <utf8proc.h>

#include "text/utf8.h"

namespace lily::unicode {
namespace {

constexpr uint32_t kTableEnd = 0x30000;

// Code points that utf8proc 2.8 (Unicode 15) gives a non-zero combining class, while HF
// tokenizers' NFC (the older Unicode data of its unicode-normalization fork) treats them as
// unassigned: a starter that neither reorders nor composes. Found by normalizing a probe
// ("a" c U+0334 c U+0301 U+0316 c "x" U+0301) for every code point with both libraries; the
// node oracle test re-checks it on every combining-mark block.
constexpr uint32_t kHfUnassigned[][2] = {
    {0x7fd, 0x7fd},     {0x898, 0x89f},     {0x8ca, 0x8d3},     {0x9fe, 0x9fe},     {0xc3c, 0xc3c},
    {0xd3b, 0xd3c},     {0xeba, 0xeba},     {0x1715, 0x1715},   {0x1abf, 0x1ace},   {0x1df6, 0x1dfa},
    {0xa82c, 0xa82c},   {0x10d24, 0x10d27}, {0x10eab, 0x10eac}, {0x10efd, 0x10eff}, {0x10f46, 0x10f50},
    {0x10f82, 0x10f85}, {0x11070, 0x11070}, {0x1133b, 0x1133b}, {0x1145e, 0x1145e}, {0x11839, 0x1183a},
    {0x1193d, 0x1193e}, {0x11943, 0x11943}, {0x119e0, 0x119e0}, {0x11a34, 0x11a34}, {0x11a47, 0x11a47},
    {0x11a99, 0x11a99}, {0x11d42, 0x11d42}, {0x11d44, 0x11d45}, {0x11d97, 0x11d97}, {0x11f41, 0x11f42},
    {0x16ff0, 0x16ff1}, {0x1e08f, 0x1e08f}, {0x1e130, 0x1e136}, {0x1e2ae, 0x1e2ae}, {0x1e2ec, 0x1e2ef},
    {0x1e4ec, 0x1e4ef},
};

bool hf_unassigned(uint32_t cp) {
  if (cp < 0x7fd) return false;
  for (const auto& r : kHfUnassigned)
    if (cp >= r[0] && cp <= r[1]) return true;
  return false;
}

std::string utf8proc_nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &out,
                                    static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(s);  // input is validated UTF-8 upstream; keep it if rejected
  std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

struct InertTable {
  std::vector<bool> inert;  // [kTableEnd]
  InertTable() : inert(kTableEnd, true) {
    std::vector<bool> second(kTableEnd, false);
    std::vector<bool> decomposes(kTableEnd, false);
    std::vector<utf8proc_int32_t> first(kTableEnd, 0);
    utf8proc_int32_t buf[32];
    for (uint32_t cp = 0x300; cp < kTableEnd; ++cp) {
      if (cp >= 0xD800 && cp < 0xE000) continue;
      int bound = 0;
      utf8proc_ssize_t n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 32,
                                                   UTF8PROC_DECOMPOSE, &bound);
      if (n <= 0) continue;
      if (n == 1 && buf[0] == static_cast<utf8proc_int32_t>(cp)) continue;
      decomposes[cp] = true;
      first[cp] = buf[0];
      for (utf8proc_ssize_t k = 1; k < n; ++k)
        if (static_cast<uint32_t>(buf[k]) < kTableEnd) second[buf[k]] = true;
    }
    for (uint32_t cp = 0x300; cp < kTableEnd; ++cp) {
      if (cp >= 0xD800 && cp < 0xE000) { inert[cp] = false; continue; }
      bool ok = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp))->combining_class == 0 &&
                !second[cp];
      if (ok && decomposes[cp]) {
        if (static_cast<uint32_t>(first[cp]) < kTableEnd && second[first[cp]]) ok = false;
        if (ok) {
          std::string one;
          utf8::append_cp(cp, one);
          ok = utf8proc_nfc(one) == one;
        }
      }
      inert[cp] = ok;
    }
  }
};

const InertTable& inert_table() {
  static const InertTable t;
  return t;
}

}  // namespace

bool nfc_quick_check(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  const InertTable* t = nullptr;
  while (i < n) {
    // Code points below U+0300 are always inert; U+0300 is 0xCC 0x80, so lead bytes < 0xCC
    // are the fast path.
    if (p[i] < 0xCC) { ++i; continue; }
    uint32_t cp = utf8::next_cp(s, i);
    if (cp >= kTableEnd) return false;
    if (!t) t = &inert_table();
    if (!t->inert[cp]) return false;
  }
  return true;
}

bool nfc_into(std::string_view s, std::string& out) {
  if (nfc_quick_check(s)) return false;
  // Only the stretches around non-inert code points go through utf8proc. A stretch starts at
  // the last inert code point before the trouble (a starter that nothing before it can
  // combine with or reorder past, though marks after it may compose with it) and ends before
  // the next inert one. An HF-unassigned code point is a plain starter to HF that composes
  // with nothing, so it bounds a stretch on both sides and is copied as is.
  const InertTable& t = inert_table();
  auto inert = [&](uint32_t cp) { return cp < 0x300 || (cp < kTableEnd && t.inert[cp]); };
  out.clear();
  out.reserve(s.size() + 16);
  size_t copied = 0, boundary = 0, i = 0;
  while (i < s.size()) {
    size_t at = i;
    uint32_t cp = utf8::next_cp(s, i);
    if (inert(cp)) {
      boundary = at;
      continue;
    }
    if (hf_unassigned(cp)) {
      boundary = i;
      continue;
    }
    size_t end = i;
    while (end < s.size()) {
      size_t k = end;
      uint32_t c2 = utf8::next_cp(s, k);
      if (inert(c2) || hf_unassigned(c2)) break;
      end = k;
    }
    out.append(s.data() + copied, boundary - copied);
    out += utf8proc_nfc(s.substr(boundary, end - boundary));
    copied = boundary = i = end;
  }
  out.append(s.data() + copied, s.size() - copied);
  return true;
}

std::string nfc(std::string_view s) {
  std::string out;
  if (!nfc_into(s, out)) return std::string(s);
  return out;
}

bool is_white_space(uint32_t cp) {
  if (cp >= 0x09 && cp <= 0x0D) return true;
  switch (cp) {
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F:
    case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80)
    return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;
  if (cp >= 0x24B6 && cp <= 0x24E9) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

}  // namespace lily::unicode
