// Python str methods over UTF-8. Indices are code points, whitespace is Unicode whitespace, case
// mapping is utf8proc's simple mapping (Python's full mapping differs only for a few letters, e.g. ß).
#include "text/jinja/pystr.h"

#include <algorithm>

#include <utf8proc.h>

#include "text/jinja/value.h"

namespace lily::jinja::pystr {

std::u32string decode(const std::string& s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t n = static_cast<utf8proc_ssize_t>(s.size()), i = 0;
  while (i < n) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t len = utf8proc_iterate(p + i, n - i, &cp);
    if (len <= 0) {
      out.push_back(0xFFFD);
      i += 1;
    } else {
      out.push_back(static_cast<char32_t>(cp));
      i += len;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  utf8proc_uint8_t buf[4];
  utf8proc_ssize_t len = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(len));
}

std::string encode(const std::u32string& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

size_t length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

static const utf8proc_property_t* prop(char32_t c) { return utf8proc_get_property(static_cast<utf8proc_int32_t>(c)); }

bool is_space(char32_t c) {
  if (c < 128) return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f);
  const auto* p = prop(c);
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}
bool is_alpha(char32_t c) {
  auto cat = prop(c)->category;
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_LO;
}
bool is_digit(char32_t c) { return prop(c)->category == UTF8PROC_CATEGORY_ND; }
bool is_upper(char32_t c) { return prop(c)->category == UTF8PROC_CATEGORY_LU; }
bool is_lower(char32_t c) { return prop(c)->category == UTF8PROC_CATEGORY_LL; }
static bool is_cased(char32_t c) {
  auto cat = prop(c)->category;
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
static char32_t to_upper(char32_t c) { return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
static char32_t to_lower(char32_t c) { return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
static char32_t to_title(char32_t c) { return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

std::string strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  std::u32string u = decode(s);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return encode(u.substr(b, e - b));
}

std::string upper(const std::string& s) {
  std::u32string u = decode(s);
  for (auto& c : u) c = to_upper(c);
  return encode(u);
}
std::string lower(const std::string& s) {
  std::u32string u = decode(s);
  for (auto& c : u) c = to_lower(c);
  return encode(u);
}
std::string title(const std::string& s) {
  std::u32string u = decode(s);
  bool prev_cased = false;
  for (auto& c : u) {
    c = prev_cased ? to_lower(c) : to_title(c);
    prev_cased = is_cased(c);
  }
  return encode(u);
}
std::string capitalize(const std::string& s) {
  std::u32string u = decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_title(u[i]) : to_lower(u[i]);
  return encode(u);
}

std::vector<std::string> split(const std::string& s, const std::optional<std::string>& sep, long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw Error("ValueError: empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<long>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string::npos) break;
      out.push_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.push_back(s.substr(pos));
    return out;
  }
  std::u32string u = decode(s);
  size_t i = 0, n = u.size();
  while (true) {
    while (i < n && is_space(u[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<long>(out.size()) >= maxsplit) {
      out.push_back(encode(u.substr(i)));  // the remainder keeps its trailing whitespace
      break;
    }
    size_t j = i;
    while (j < n && !is_space(u[j])) ++j;
    out.push_back(encode(u.substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(const std::string& s, const std::optional<std::string>& sep, long maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) throw Error("ValueError: empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<long>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string::npos) break;
      out.push_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::u32string u = decode(s);
  long j = static_cast<long>(u.size());
  while (true) {
    while (j > 0 && is_space(u[j - 1])) --j;
    if (j <= 0) break;
    if (maxsplit >= 0 && static_cast<long>(out.size()) >= maxsplit) {
      out.push_back(encode(u.substr(0, j)));  // the remainder keeps its leading whitespace
      break;
    }
    long i = j;
    while (i > 0 && !is_space(u[i - 1])) --i;
    out.push_back(encode(u.substr(i, j - i)));
    j = i;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(const std::string& s, bool keepends) {
  std::u32string u = decode(s);
  std::vector<std::string> out;
  size_t i = 0, start = 0, n = u.size();
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e ||
           c == 0x85 || c == 0x2028 || c == 0x2029;
  };
  while (i < n) {
    if (is_break(u[i])) {
      size_t eol = i + 1;
      if (u[i] == '\r' && i + 1 < n && u[i + 1] == '\n') eol = i + 2;
      out.push_back(encode(u.substr(start, (keepends ? eol : i) - start)));
      start = i = eol;
    } else {
      ++i;
    }
  }
  if (start < n) out.push_back(encode(u.substr(start)));
  return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, long count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` between every character and at both ends
    std::u32string u = decode(s);
    long done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < u.size()) append_utf8(out, u[i]);
    }
    return out;
  }
  size_t pos = 0;
  long done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += with;
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

long find(const std::string& s, const std::string& sub, bool reverse) {
  size_t hit = reverse ? s.rfind(sub) : s.find(sub);
  if (hit == std::string::npos) return -1;
  return static_cast<long>(length(s.substr(0, hit)));
}

long count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<long>(length(s)) + 1;
  long n = 0;
  for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0 && s.size() >= p.size(); }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace lily::jinja::pystr
