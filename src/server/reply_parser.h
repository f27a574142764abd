// A reply's text stream → reasoning, content and tool calls, in order: the reasoning parser
// first, then the tool-call parser on the content (calls written inside the reasoning stay
// reasoning).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace lily {

struct ReplyParserOptions {
  bool parse_reasoning = true;   // false: raw completions, everything is content
  bool in_reasoning = false;     // the prompt opened <think>
  bool parse_tools = false;      // tools given and tool_choice != none
  nlohmann::ordered_json tools;  // the request's tools array
  bool parallel_tool_calls = true;
  uint64_t id_seed = 0;          // for call ids
};

class ReplyParser {
 public:
  explicit ReplyParser(const ReplyParserOptions& o);
  ReplyDelta push(std::string_view piece);
  ReplyDelta flush();
  int n_calls() const { return tools_.n_calls(); }
  bool in_reasoning() const { return o_.parse_reasoning && reasoning_.in_reasoning(); }

 private:
  ReplyDelta route(ReasoningParser::Delta d, bool final);
  ReplyParserOptions o_;
  ReasoningParser reasoning_;
  ToolCallParser tools_;
};

}  // namespace lily
