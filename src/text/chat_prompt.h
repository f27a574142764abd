// OpenAI chat-completions request -> chat-template context -> prompt text. Shared by `lily render`
// and the server; the conversion rules are the ones tools/make_template_goldens.py documents and
// replays in Python, so goldens cover both halves.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/chat_template.h"

namespace lily {

struct ChatPromptOptions {
  std::string bos_token, eos_token;     // put in the context when non-empty
  std::optional<bool> enable_thinking;  // overrides the request's chat_template_kwargs
};

// The template context for a request body (an error Status names the offending field: a 400).
//   messages: array of objects; role system|developer (-> system)|user|assistant|tool;
//   content: string, null/missing (-> ""), or array of {"type":"text","text":...} parts (joined);
//   assistant: reasoning_content passed through; tool_calls passed through with
//     function.arguments parsed from its JSON string into an object (an object is kept);
//   tool: tool_call_id and name passed through;
//   then tools (if present), add_generation_prompt = true, bos/eos tokens, the request's
//   chat_template_kwargs merged over all of it, and finally opts.enable_thinking.
// Key order is kept (ordered_json) because templates print tools with tojson.
Result<nlohmann::ordered_json> chat_template_context(const nlohmann::ordered_json& request,
                                                     const ChatPromptOptions& opts);

Result<std::string> render_chat_prompt(const ChatTemplate& tmpl, const nlohmann::ordered_json& request,
                                       const ChatPromptOptions& opts);
// Convenience for callers holding a nlohmann::json: its objects are key-sorted, so tool schemas
// print in sorted order rather than as the client sent them. Prefer the ordered_json overload.
Result<std::string> render_chat_prompt(const ChatTemplate& tmpl, const nlohmann::json& request,
                                       const ChatPromptOptions& opts);

}  // namespace lily
