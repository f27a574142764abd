// Fuzz target: the Jinja lexer, parser and renderer. The input is a template source, optionally
// followed by kSep and a JSON context object; without one, a chat-like default context is used.
// Parse and render either succeed or return an error Status: nothing may escape as an exception.
#include "fuzz_util.h"
#include "text/chat_template.h"

namespace {

constexpr std::string_view kSep = "\n#--lily-fuzz-context--#\n";

const nlohmann::ordered_json& default_context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in Paris? <tool_call> \u00e9\u4e2d"},
      {"role": "assistant", "content": "", "reasoning_content": "call it",
       "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "n": 3}}}]},
      {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1"},
      {"role": "assistant", "content": "<think>\nok\n</think>\n\nIt is 21."},
      {"role": "user", "content": "Thanks"}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
      "required": ["city"]}}}],
    "add_generation_prompt": true, "enable_thinking": false, "bos_token": "", "eos_token": "<|im_end|>"
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  auto parts = fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), kSep);
  auto tmpl = ChatTemplate::parse(std::string(parts[0]));
  if (!tmpl.is_ok()) {
    LILY_FUZZ_ASSERT(!tmpl.message().empty(), "a parse error without a message");
    return 0;
  }
  nlohmann::ordered_json ctx = default_context();
  if (parts.size() > 1) {
    auto j = nlohmann::ordered_json::parse(parts[1], nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) ctx = std::move(j);
  }
  auto out = tmpl.value().render(ctx);
  (void)out;
  return 0;
}
