// Turns the content stream of a reply into text and tool calls. Qwen writes calls as
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
// A call is held back until its closing tag, then parsed whole: a malformed or unfinished call
// is released as ordinary content, so the stream never breaks. Values are typed by the tool's
// JSON schema (a "string" parameter stays text; numbers, booleans, objects are parsed).
#pragma once
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily {

struct ToolCall {
  std::string id;         // "call_…"
  std::string name;
  std::string arguments;  // a JSON object, as text
};

// Parses the text between <tool_call> and </tool_call>. tools: the request's OpenAI `tools`
// array (may be null); when it lists functions, an unknown name is malformed.
std::optional<ToolCall> parse_tool_call_block(std::string_view block, const nlohmann::ordered_json& tools);

// Converts a parameter's raw text to the JSON type its schema names.
nlohmann::ordered_json typed_value(const std::string& raw, const nlohmann::ordered_json& schema);

class ToolCallParser {
 public:
  ToolCallParser(nlohmann::ordered_json tools, bool parallel, uint64_t id_seed);

  struct Delta {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Delta push(std::string_view piece);
  Delta flush();  // end of reply: an unfinished call becomes content (or a call, if complete)
  int n_calls() const { return n_calls_; }

 private:
  void step(Delta& out, bool final);
  void finish_call(Delta& out, std::string_view block, bool closed);
  std::string new_id();

  nlohmann::ordered_json tools_;
  bool parallel_;
  std::mt19937_64 rng_;
  bool in_call_ = false;
  std::string buf_;
  std::string ws_before_;  // blank text just before the open call
  int n_calls_ = 0;
};

}  // namespace lily
