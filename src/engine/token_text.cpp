// TokenText: see token_text.h.
#include "engine/token_text.h"

namespace lily {

TokenText::TokenText(const Tokenizer& tok) : dec_(tok, /*skip_special_tokens=*/true) {
  const auto& m = tok.markers();
  for (auto id : {m.think_open, m.think_close, m.tool_call_open, m.tool_call_close})
    if (id) markers_.push_back({*id, tok.decode(std::span<const int32_t>(&*id, 1), false)});
}

std::string TokenText::push(int32_t id) {
  for (const auto& [mid, text] : markers_)
    if (id == mid) return dec_.flush() + text;
  return dec_.push(id);
}

std::string TokenText::flush() { return dec_.flush(); }

}  // namespace lily
