// Fuzz target: a hostile chat request rendered by the real Qwen3.6 chat template, both as
// `lily render` does (the body straight to the template context) and as the server does (the
// request validated first). Errors are Status values; the prompt of an accepted request encodes.
#include "fuzz_util.h"
#include "server/openai_request.h"
#include "text/chat_prompt.h"

LILY_FUZZ_PRELOAD(lily::fuzz::qwen_template())

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  const ChatTemplate& tmpl = fuzz::qwen_template();
  nlohmann::ordered_json body;  // the server's body parser (UTF-8, depth, JSON)
  if (parse_request_body(std::string_view(reinterpret_cast<const char*>(data), size), body)) return 0;
  ChatPromptOptions opts;
  opts.eos_token = "<|im_end|>";
  auto raw = render_chat_prompt(tmpl, body, opts);  // `lily render`
  (void)raw;

  ApiRequest req;  // the server: validate, then render the validated messages
  if (parse_chat_request(body, /*test_hooks=*/false, req)) return 0;
  nlohmann::ordered_json ctx_body = nlohmann::ordered_json::object();
  ctx_body["messages"] = req.messages;
  if (req.tools.is_array()) ctx_body["tools"] = req.tools;
  ctx_body["chat_template_kwargs"] = req.template_kwargs;
  opts.enable_thinking = req.enable_thinking;
  auto prompt = render_chat_prompt(tmpl, ctx_body, opts);
  if (prompt.is_ok()) LILY_FUZZ_ASSERT(prompt.value().find("<|im_start|>") != std::string::npos, prompt.value());
  return 0;
}
