// Fuzz target: the reasoning and tool-call stream parsers on model output. Byte 0 picks the
// options; the rest is the reply text (lossy-repaired: the stream decoder only emits valid
// UTF-8), cut into pieces at each 0x1F byte. Properties: the split does not change the result
// (same reasoning, content and calls as one piece), every call's arguments are a JSON object,
// and without parsing everything is content, verbatim.
#include "fuzz_util.h"
#include "server/reply_parser.h"
#include "text/utf8.h"

namespace {

const nlohmann::ordered_json& tools() {
  static const nlohmann::ordered_json t = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "scale": {"type": "number"}, "opts": {"type": "object"}, "tags": {"type": "array"},
      "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "nothing": {"type": "null"},
      "multi": {"type": ["number", "null"]}}}}},
    {"type": "function", "function": {"name": "noop"}}
  ])");
  return t;
}

struct Out {
  std::string reasoning, content;
  std::vector<lily::ToolCall> calls;
};

Out run(const lily::ReplyParserOptions& o, const std::vector<std::string_view>& pieces) {
  lily::ReplyParser p(o);
  lily::ReplyDelta all;
  for (auto piece : pieces) all.append(p.push(piece));
  all.append(p.flush());
  return {all.reasoning(), all.content(), all.calls()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  if (size < 1) return 0;
  ReplyParserOptions o;
  o.parse_reasoning = data[0] & 1;
  o.in_reasoning = data[0] & 2;
  o.parse_tools = data[0] & 4;
  o.parallel_tool_calls = data[0] & 8;
  if (data[0] & 16) o.tools = tools();  // else null: any function name is accepted
  o.id_seed = 42;
  std::string text = utf8::to_valid_lossy(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
  std::vector<std::string_view> pieces = fuzz::split(text, "\x1f");
  std::string whole;
  for (auto p : pieces) whole += p;

  Out split = run(o, pieces);
  Out one = run(o, {whole});
  LILY_FUZZ_ASSERT(split.reasoning == one.reasoning, "reasoning depends on the split");
  LILY_FUZZ_ASSERT(split.content == one.content, "content depends on the split");
  LILY_FUZZ_ASSERT(split.calls.size() == one.calls.size(), "calls depend on the split");
  for (size_t i = 0; i < one.calls.size(); ++i) {
    LILY_FUZZ_ASSERT(split.calls[i].name == one.calls[i].name && split.calls[i].arguments == one.calls[i].arguments,
                     "call depends on the split");
    auto args = nlohmann::json::parse(one.calls[i].arguments, nullptr, false);
    LILY_FUZZ_ASSERT(args.is_object(), one.calls[i].arguments);
    LILY_FUZZ_ASSERT(!one.calls[i].name.empty() && one.calls[i].id.rfind("call_", 0) == 0, "call name/id");
  }
  if (!o.parse_reasoning && !o.parse_tools) {
    LILY_FUZZ_ASSERT(one.content == whole && one.reasoning.empty(), "unparsed text must pass through");
  }
  LILY_FUZZ_ASSERT(utf8::is_valid(one.content) && utf8::is_valid(one.reasoning), "output is not valid UTF-8");
  return 0;
}
