// ReasoningParser: see reasoning_parser.h. Whitespace at the edges of the reasoning is held
// back and trimmed (the template writes "<think>\n…\n</think>\n\n"), like the template's own
// trimming when it renders the reasoning back.
#include "server/reasoning_parser.h"

#include <algorithm>

namespace lily {

static constexpr std::string_view kOpen = "<think>";
static constexpr std::string_view kClose = "</think>";

size_t partial_suffix(std::string_view buf, std::string_view marker) {
  size_t max_len = std::min(marker.size() - 1, buf.size());
  for (size_t len = max_len; len > 0; --len)
    if (buf.substr(buf.size() - len) == marker.substr(0, len)) return len;
  return 0;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static size_t trailing_ws(std::string_view s) {
  size_t n = 0;
  while (n < s.size() && is_ws(s[s.size() - 1 - n])) ++n;
  return n;
}

ReasoningParser::ReasoningParser(bool in_reasoning) : mode_(in_reasoning ? Mode::kReasoning : Mode::kStart) {}

ReasoningParser::Delta ReasoningParser::push(std::string_view piece) {
  Delta out;
  buf_.append(piece);
  step(out, false);
  return out;
}

ReasoningParser::Delta ReasoningParser::flush() {
  Delta out;
  step(out, true);
  return out;
}

void ReasoningParser::step(Delta& out, bool final) {
  for (;;) {
    if (mode_ == Mode::kStart) {
      // A reply may open its own think block, after optional whitespace.
      size_t i = 0;
      while (i < buf_.size() && is_ws(buf_[i])) ++i;
      std::string_view rest = std::string_view(buf_).substr(i);
      if (rest.substr(0, kOpen.size()) == kOpen) {
        buf_.erase(0, i + kOpen.size());
        mode_ = Mode::kReasoning;
        continue;
      }
      if (!final && kOpen.substr(0, rest.size()) == rest) return;  // could still be <think>
      mode_ = Mode::kContent;
      content_started_ = true;  // no think block: leading whitespace is the model's own
      continue;
    }
    if (mode_ == Mode::kReasoning) {
      if (!reasoning_started_) {
        size_t i = 0;
        while (i < buf_.size() && buf_[i] == '\n') ++i;
        buf_.erase(0, i);
        if (buf_.empty()) return;
        reasoning_started_ = true;
      }
      size_t close = buf_.find(kClose);
      if (close != std::string::npos) {
        std::string_view body = std::string_view(buf_).substr(0, close);
        out.reasoning.append(body.substr(0, body.size() - trailing_ws(body)));
        buf_.erase(0, close + kClose.size());
        mode_ = Mode::kContent;
        continue;
      }
      size_t hold = final ? 0 : partial_suffix(buf_, kClose);
      std::string_view emit = std::string_view(buf_).substr(0, buf_.size() - hold);
      size_t ws = trailing_ws(emit);  // held until something follows it (trimmed at the end)
      out.reasoning.append(emit.substr(0, emit.size() - ws));
      if (final) buf_.clear();
      else buf_.erase(0, emit.size() - ws);
      return;
    }
    // Content.
    if (!content_started_) {
      size_t i = 0;
      while (i < buf_.size() && is_ws(buf_[i])) ++i;
      buf_.erase(0, i);
      if (buf_.empty()) return;
      content_started_ = true;
    }
    out.content.append(buf_);
    buf_.clear();
    return;
  }
}

}  // namespace lily
