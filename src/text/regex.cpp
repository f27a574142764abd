// PCRE2 wrapper. Input is validated UTF-8 upstream, so matches skip PCRE2's UTF check. A
// thread-local 8 MiB JIT stack lets patterns like \s+(?!\S) run over very long whitespace runs.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>

namespace lily {
namespace {

struct ThreadMatchState {
  pcre2_match_data* md = nullptr;
  pcre2_match_context* mctx = nullptr;
  pcre2_jit_stack* stack = nullptr;
  ThreadMatchState() {
    md = pcre2_match_data_create(64, nullptr);
    mctx = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (stack) pcre2_jit_stack_assign(mctx, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mctx);
    if (stack) pcre2_jit_stack_free(stack);
  }
};

ThreadMatchState& thread_state() {
  thread_local ThreadMatchState st;
  return st;
}

// Unicode White_Space, which is what \s means in the Oniguruma patterns HF runs. PCRE2's UCP
// \s differs (it also takes U+180E), so \s and \S are spelled out.
constexpr const char* kWhiteSpace = R"(\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

Result<std::string> rewrite_spaces(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[++i];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        if (in_class) return errorf("regex '{}': \\S inside a character class is not supported", p);
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else if (e == 'Q') {
        return errorf("regex '{}': \\Q is not supported", p);
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is literal
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Regex>> Regex::compile(const std::string& pattern_in, bool literal) {
  int err = 0;
  PCRE2_SIZE off = 0;
  std::string pattern = pattern_in;
  if (!literal) {
    LILY_ASSIGN_OR_RETURN(pattern, rewrite_spaces(pattern_in));
  }
  uint32_t opts = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts,
                                   &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return errorf("regex '{}' does not compile at offset {}: {}", pattern, off, reinterpret_cast<char*>(buf));
  }
  std::unique_ptr<Regex> r(new Regex());
  r->code_ = code;
  r->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

int Regex::match_at(std::string_view s, size_t pos, size_t& ms, size_t& me) const {
  auto& st = thread_state();
  auto* code = static_cast<pcre2_code*>(code_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, st.md, st.mctx)
                : PCRE2_ERROR_JIT_BADOPTION;
  if (rc == PCRE2_ERROR_JIT_BADOPTION || rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(code, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, st.md, st.mctx);
  if (rc == PCRE2_ERROR_NOMATCH) return 0;
  if (rc < 0 && rc != 0) return -1;
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.md);
  ms = ov[0];
  me = ov[1];
  return 1;
}

}  // namespace lily
