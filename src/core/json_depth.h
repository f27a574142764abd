// Nesting depth of JSON text, found by a linear scan before parsing. nlohmann::json parses
// iteratively but copies, dumps and compares recursively, so a document nested 10^5 deep (a
// few hundred KB of '[') overflows the stack later: every reader of outside JSON refuses depth
// beyond what its format needs before it parses.
#pragma once
#include <cstddef>
#include <string_view>

namespace lily {

// Deepest nesting of [ and { outside strings (0 for a scalar). Exact for valid JSON; for other
// text it is some count the parser will reject anyway.
inline size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // skip the escaped character (\" in particular)
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace lily
