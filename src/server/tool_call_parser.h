// Turns the content stream of a reply into text and tool calls, as they are generated. Qwen
// writes calls as
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
// A call starts (id and name go out) once <function=NAME> names a known tool; its arguments then
// stream as JSON text: {"P": …} piece by piece, string parameters character by character, other
// types (typed by the tool's JSON schema: numbers, booleans, objects) when their value closes. A
// block that does not name a known function is released as ordinary content, so the stream never
// breaks; a known call whose body is malformed or cut short ends with the parameters it has.
#pragma once
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily {

// One piece of a reply, in order: reasoning text, content text, or a step of a tool call.
struct ReplyItem {
  enum class Kind { kReasoning, kContent, kCall };
  Kind kind = Kind::kContent;
  std::string text;        // reasoning/content text, or the next piece of the call's arguments
  int call = -1;           // kCall: the call's index in the reply
  std::string id, name;    // kCall: set on the call's first item (begin)
  bool begin = false, end = false;
};

struct ToolCall {
  std::string id;         // "call_…"
  std::string name;
  std::string arguments;  // a JSON object, as text
};

// Items in order; adjacent text of one kind is merged.
struct ReplyDelta {
  std::vector<ReplyItem> items;
  void add_text(ReplyItem::Kind k, std::string_view s);
  void add(ReplyItem it);
  void append(ReplyDelta&& d);
  bool empty() const { return items.empty(); }
  std::string text(ReplyItem::Kind k) const;  // all reasoning, or all content
  std::string reasoning() const { return text(ReplyItem::Kind::kReasoning); }
  std::string content() const { return text(ReplyItem::Kind::kContent); }
  // Calls that ended in this delta, assembled (tests and whole replies).
  std::vector<ToolCall> calls() const;
};

// Converts a parameter's raw text to the JSON type its schema names.
nlohmann::ordered_json typed_value(const std::string& raw, const nlohmann::ordered_json& schema);

class ToolCallParser {
 public:
  ToolCallParser(nlohmann::ordered_json tools, bool parallel, uint64_t id_seed);
  // Content text in; content and call items out (appended to `out`).
  void push(std::string_view piece, ReplyDelta& out);
  void flush(ReplyDelta& out);  // end of reply: a call in progress ends with what it has
  int n_calls() const { return n_calls_; }

 private:
  enum class Mode { kText, kHead, kBody, kValue, kAfterFunction };
  void step(ReplyDelta& out, bool final);
  void args(ReplyDelta& out, std::string_view s, bool end = false);
  void end_call(ReplyDelta& out);
  void close_value(ReplyDelta& out, std::string_view raw);
  std::string new_id();

  nlohmann::ordered_json tools_;
  bool parallel_;
  std::mt19937_64 rng_;
  Mode mode_ = Mode::kText;
  std::string buf_;
  std::string ws_before_;   // blank text just before the open call
  int n_calls_ = 0;         // calls started
  bool muted_ = false;      // a call beyond the first with parallel_tool_calls = false: parsed, not sent
  bool first_param_ = true;
  bool skip_newline_ = false;        // the newline that frames a value
  bool string_param_ = false;        // streaming a string value
  nlohmann::ordered_json props_;         // the called tool's parameter schemas
  nlohmann::ordered_json param_schema_;  // the open parameter's
};

}  // namespace lily
