// Fuzz target: an HTTP request body as the server sees it: parse_request_body, then chat and completion
// validation (with and without test hooks). An accepted chat request's tools then type a fixed
// tool call through the reply parser, as the server does with the model's output. Also checks
// the server's valid_utf8 against the text layer's validator on the raw bytes.
#include "fuzz_util.h"
#include "server/openai_request.h"
#include "server/reply_parser.h"
#include "text/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  std::string_view raw(reinterpret_cast<const char*>(data), size);
  LILY_FUZZ_ASSERT(valid_utf8(raw) == utf8::is_valid(raw), "valid_utf8 and utf8::is_valid disagree");
  nlohmann::ordered_json body;
  if (auto e = parse_request_body(raw, body)) {  // what the server does with the HTTP body
    LILY_FUZZ_ASSERT(e->status == 400, e->message);
    return 0;
  }
  for (bool hooks : {false, true}) {
    ApiRequest req;
    if (auto e = parse_completion_request(body, hooks, req)) {
      LILY_FUZZ_ASSERT(e->status == 400 && !e->message.empty(), e->message);
      (void)e->to_json().dump();  // the server sends it with a plain dump(): must not throw
    } else {
      LILY_FUZZ_ASSERT(!req.prompt.empty() && !req.chat, "accepted completion");
    }
    if (auto e = parse_chat_request(body, hooks, req)) {
      LILY_FUZZ_ASSERT(e->status == 400 && !e->message.empty(), e->message);
      (void)e->to_json().dump();
      continue;
    }
    LILY_FUZZ_ASSERT(req.chat && req.messages.is_array() && !req.messages.empty(), "accepted chat");
    ReplyParserOptions o;
    o.parse_tools = req.tools.is_array() && req.tool_choice != "none";
    o.tools = req.tools;
    o.parallel_tool_calls = req.parallel_tool_calls;
    o.id_seed = req.seed.value_or(1);
    ReplyParser p(o);
    std::string name = req.tools.is_array() && !req.tools.empty() ? req.tools[0]["function"]["name"].get<std::string>() : "f";
    std::string out = "<think>\nhm\n</think>\n\nok\n\n<tool_call>\n<function=" + name +
                      ">\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n{\"x\": [true]}\n</parameter>\n</function>\n</tool_call>";
    ReplyDelta d = p.push(utf8::to_valid_lossy(out));
    d.append(p.flush());
    for (const auto& c : d.calls()) {
      auto args = nlohmann::json::parse(c.arguments, nullptr, false);
      LILY_FUZZ_ASSERT(args.is_object(), c.arguments);
    }
  }
  return 0;
}
