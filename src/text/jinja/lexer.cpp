// Jinja lexer. Mirrors jinja2.lexer's regex rules: text runs up to the next "{{", "{%" or "{#";
// the text's tail is stripped by a '-' sign, or (lstrip_blocks) when only spaces separate a
// block/comment tag from the line start; '%}' / '#}' eat one following newline (trim_blocks);
// '-%}' / '-}}' / '-#}' eat all following whitespace. Inside tags, end markers only count
// while brackets are balanced.
#include "text/jinja/lexer.h"

#include <cctype>

#include "text/jinja/pystr.h"
#include "text/jinja/value.h"

namespace lily::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.rstrip() (Unicode whitespace).
std::string rstrip_all(const std::string& s) { return pystr::strip(s, std::nullopt, false, true); }
// \s* fullmatch over s[from:], Python regex \s on str is Unicode whitespace.
bool all_space(const std::string& s, size_t from) {
  for (char32_t c : pystr::decode(s.substr(from)))
    if (!pystr::is_space(c)) return false;
  return true;
}
// Skip \s* (Unicode whitespace) from pos.
size_t skip_space(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[pos]);
    if (c < 0x80) {
      if (!pystr::is_space(c)) break;
      ++pos;
      continue;
    }
    size_t len = (c >= 0xF0) ? 4 : (c >= 0xE0) ? 3 : 2;
    std::u32string u = pystr::decode(s.substr(pos, len));
    if (u.size() != 1 || !pystr::is_space(u[0])) break;
    pos += len;
  }
  return pos;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t start = find_tag(pos);
      if (start == std::string::npos) {
        push_text(src_.substr(pos), pos);
        break;
      }
      char kind = src_[start + 1];  // '{', '%', '#'
      char sign = start + 2 < src_.size() ? src_[start + 2] : 0;
      if (sign != '-' && sign != '+') sign = 0;
      std::string text = src_.substr(pos, start - pos);
      bool raw = kind == '%' && is_raw_begin(start);
      if (sign == '-') {
        text = rstrip_all(text);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && all_space(text, l_pos)) text.resize(l_pos);
      }
      push_text(text, pos);
      size_t body = start + 2 + (sign ? 1 : 0);
      if (raw) {
        pos = lex_raw(body, line_starting);
      } else if (kind == '#') {
        pos = lex_comment(start, body, line_starting);
      } else {
        pos = lex_tag(kind == '%', start, body, line_starting);
      }
    }
    tokens_.push_back(Token{Tok::Eof, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;

  int line_at(size_t pos) {
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_)
      if (src_[line_pos_] == '\n') ++line_;
    return line_;
  }
  [[noreturn]] void fail(size_t pos, const std::string& msg) { throw Error(msg, line_at(pos)); }

  size_t find_tag(size_t pos) const {
    for (size_t k = pos; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return std::string::npos;
  }
  void push_text(const std::string& text, size_t pos) {
    if (!text.empty()) tokens_.push_back(Token{Tok::Text, text, line_at(pos)});
  }

  // {%[-+]?\s*raw\s*(-%}|%})
  bool is_raw_begin(size_t start) const {
    size_t p = start + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_ws(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t body, bool& line_starting) {
    size_t p = src_.find("raw", body) + 3;
    while (is_ws(src_[p])) ++p;
    if (src_[p] == '-') p = skip_space(src_, p + 3);
    else p += 2;
    // Find {%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)
    for (size_t k = src_.find("{%", p); k != std::string::npos; k = src_.find("{%", k + 2)) {
      size_t q = k + 2;
      char sign = (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ? src_[q] : 0;
      if (sign) ++q;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_ws(src_[q])) ++q;
      std::string text = src_.substr(p, k - p);
      if (sign == '-') {
        text = rstrip_all(text);
      } else if (sign != '+') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 && all_space(text, l_pos)) text.resize(l_pos);
      }
      push_text(text, p);
      return finish_block_end(q, line_starting, "endraw");
    }
    fail(p, "TemplateSyntaxError: missing endraw");
  }

  // After a block's closing marker position q (pointing at '+%}', '-%}' or '%}').
  size_t finish_block_end(size_t q, bool& line_starting, const char* what) {
    if (src_.compare(q, 3, "+%}") == 0) {
      line_starting = false;
      return q + 3;
    }
    if (src_.compare(q, 3, "-%}") == 0) {
      size_t e = skip_space(src_, q + 3);
      line_starting = e > q + 3 && src_[e - 1] == '\n';
      return e;
    }
    if (src_.compare(q, 2, "%}") == 0) {
      q += 2;
      line_starting = q < src_.size() && src_[q] == '\n';
      return line_starting ? q + 1 : q;
    }
    fail(q, std::string("TemplateSyntaxError: malformed ") + what);
  }

  size_t lex_comment(size_t start, size_t body, bool& line_starting) {
    size_t e = src_.find("#}", body);
    if (e == std::string::npos) fail(start, "TemplateSyntaxError: missing end of comment tag");
    if (e > body && src_[e - 1] == '-') {
      size_t after = skip_space(src_, e + 2);
      line_starting = after > e + 2 && src_[after - 1] == '\n';
      return after;
    }
    if (e > body && src_[e - 1] == '+') {
      line_starting = false;
      return e + 2;
    }
    e += 2;
    line_starting = e < src_.size() && src_[e] == '\n';
    return line_starting ? e + 1 : e;
  }

  size_t lex_tag(bool block, size_t start, size_t p, bool& line_starting) {
    tokens_.push_back(Token{block ? Tok::BlockBegin : Tok::VarBegin, "", line_at(start)});
    int depth = 0;
    bool after_dot = false;
    while (true) {
      p = skip_space(src_, p);
      if (p >= src_.size()) fail(start, block ? "TemplateSyntaxError: unexpected end of template, expected '%}'"
                                             : "TemplateSyntaxError: unexpected end of template, expected '}}'");
      if (depth == 0) {
        if (block && (src_.compare(p, 3, "-%}") == 0 || src_.compare(p, 3, "+%}") == 0 ||
                      src_.compare(p, 2, "%}") == 0)) {
          tokens_.push_back(Token{Tok::BlockEnd, "", line_at(p)});
          return finish_block_end(p, line_starting, "block tag");
        }
        if (!block && src_.compare(p, 3, "-}}") == 0) {
          tokens_.push_back(Token{Tok::VarEnd, "", line_at(p)});
          size_t e = skip_space(src_, p + 3);
          line_starting = e > p + 3 && src_[e - 1] == '\n';
          return e;
        }
        if (!block && src_.compare(p, 2, "}}") == 0) {
          tokens_.push_back(Token{Tok::VarEnd, "", line_at(p)});
          line_starting = false;
          return p + 2;
        }
      }
      Token t{Tok::Op, "", line_at(p)};
      char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        t.type = Tok::Name;
        t.value = src_.substr(p, e - p);
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        p = lex_number(p, after_dot, t);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, t);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                     "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
        bool found = false;
        for (const char* op : kOps) {
          size_t n = std::char_traits<char>::length(op);
          if (src_.compare(p, n, op) == 0) {
            t.value = op;
            p += n;
            found = true;
            break;
          }
        }
        if (!found) fail(p, std::string("TemplateSyntaxError: unexpected char '") + c + "'");
        if (t.value == "(" || t.value == "[" || t.value == "{") ++depth;
        if (t.value == ")" || t.value == "]" || t.value == "}") {
          if (depth == 0) fail(p, "TemplateSyntaxError: unexpected '" + t.value + "'");
          --depth;
        }
      }
      after_dot = t.type == Tok::Op && t.value == ".";
      tokens_.push_back(std::move(t));
    }
  }

  size_t lex_number(size_t p, bool int_only, Token& t) {
    auto digits = [&](size_t q) {
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
      return q;
    };
    size_t e = digits(p);
    bool is_float = false;
    if (!int_only && e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      e = digits(e + 1);
      is_float = true;
    }
    if (!int_only && e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t q = e + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        e = digits(q);
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = p; k < e; ++k)
      if (src_[k] != '_') text += src_[k];
    if (is_float) {
      t.type = Tok::Float;
      t.f = std::stod(text);
    } else {
      t.type = Tok::Int;
      try {
        t.i = std::stoll(text);
      } catch (...) {
        fail(p, "integer literal too large");
      }
    }
    t.value = text;
    return e;
  }

  size_t lex_string(size_t p, Token& t) {
    char q = src_[p];
    size_t k = p + 1;
    std::string out;
    auto hex = [&](size_t at, int n) -> char32_t {
      if (at + static_cast<size_t>(n) > src_.size()) fail(at, "truncated \\x escape in string");
      char32_t v = 0;
      for (int d = 0; d < n; ++d) {
        char h = src_[at + static_cast<size_t>(d)];
        if (!std::isxdigit(static_cast<unsigned char>(h))) fail(at, "bad escape in string literal");
        v = v * 16 + static_cast<char32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    while (true) {
      if (k >= src_.size()) fail(p, "TemplateSyntaxError: unterminated string");
      char c = src_[k];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) fail(p, "TemplateSyntaxError: unterminated string");
      char e = src_[k + 1];
      k += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': pystr::append_utf8(out, hex(k, 2)); k += 2; break;
        case 'u': pystr::append_utf8(out, hex(k, 4)); k += 4; break;
        case 'U': pystr::append_utf8(out, hex(k, 8)); k += 8; break;
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int d = 0; d < 2 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7'; ++d, ++k)
              v = v * 8 + static_cast<char32_t>(src_[k] - '0');
            pystr::append_utf8(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    t.type = Tok::String;
    t.value = std::move(out);
    return k + 1;
  }
};

std::string normalize_newlines(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\r') {
      out += '\n';
      if (k + 1 < s.size() && s[k + 1] == '\n') ++k;
    } else {
      out += s[k];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace lily::jinja
