// UTF-8 scanning per the Unicode well-formedness table (Table 3-7): the second byte's range
// depends on the lead byte, which is what makes "maximal subpart" replacement well defined.
#include "text/utf8.h"

namespace lily::utf8 {

Scan scan(const unsigned char* s, size_t n) {
  unsigned char c = s[0];
  if (c < 0x80) return {Scan::kValid, 1, c};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2; cp = c & 0x1Fu;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3; cp = c & 0x0Fu;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4; cp = c & 0x07u;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {Scan::kInvalid, 1, 0};  // 80..C1, F5..FF never start a character
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= n) return {Scan::kIncomplete, n, 0};
    unsigned char b = s[k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) return {Scan::kInvalid, k, 0};
    cp = (cp << 6) | (b & 0x3Fu);
  }
  return {Scan::kValid, need, cp};
}

bool is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) { ++i; continue; }
    Scan sc = scan(p + i, n - i);
    if (sc.kind != Scan::kValid) return false;
    i += sc.len;
  }
  return true;
}

void append_lossy(std::string_view s, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0, run = 0;  // [run, i) is a pending run of valid bytes
  while (i < n) {
    if (p[i] < 0x80) { ++i; continue; }
    Scan sc = scan(p + i, n - i);
    if (sc.kind == Scan::kValid) { i += sc.len; continue; }
    out.append(s.data() + run, i - run);
    out.append(kReplacement);
    i += sc.len;  // kIncomplete: len == n - i, the truncated tail is one subpart
    run = i;
  }
  out.append(s.data() + run, n - run);
}

std::string to_valid_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  append_lossy(s, out);
  return out;
}

size_t stable_prefix_len(std::string_view s) {
  // Only the last (up to 3) bytes can be an incomplete character; find its lead byte.
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  size_t back = n < 4 ? n : 4;
  for (size_t k = 1; k <= back; ++k) {
    size_t start = n - k;
    unsigned char c = p[start];
    if ((c & 0xC0) != 0x80) {  // not a continuation byte: a candidate lead
      Scan sc = scan(p + start, k);
      return sc.kind == Scan::kIncomplete ? start : n;
    }
  }
  return n;
}

void append_cp(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace lily::utf8
