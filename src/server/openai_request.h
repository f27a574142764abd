// OpenAI request bodies (chat completions and completions) → a validated ApiRequest, the one
// request shape the service knows (the Responses and Anthropic Messages parsers fill it too).
// Fields OpenAI defines, plus what Qwen clients send (top_k, min_p, repetition_penalty,
// chat_template_kwargs). Unknown fields are ignored; a known field of the wrong type or range
// is a 400 naming it, and so is a field that would change the result but is not supported
// (logit_bias, best_of, echo, ...).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace lily {

struct ApiRequest {
  bool chat = true;                 // false: /v1/completions
  std::string model;
  nlohmann::ordered_json messages;          // chat: validated array
  std::string prompt;               // completions
  std::optional<int> max_tokens;
  std::optional<float> temperature, top_p, min_p;
  std::optional<float> presence_penalty, frequency_penalty, repetition_penalty;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int n = 1;                        // choices (one prefill for all)
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  int top_logprobs = 0;             // chat: 0..20; completions: `logprobs` N
  nlohmann::ordered_json tools;            // array or null
  std::string tool_choice = "auto";  // auto | none | required | function
  std::string tool_choice_name;      // for "function"
  bool parallel_tool_calls = true;
  std::optional<bool> enable_thinking;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();  // chat_template_kwargs
  std::string cache_key;            // prompt_cache_key
  // Structured output (response_format / text.format / output_format).
  enum class Format { kText, kJsonObject, kJsonSchema };
  Format format = Format::kText;
  nlohmann::ordered_json format_schema;  // kJsonSchema: the schema
  std::string format_name;
  std::string format_param = "response_format";  // the field to name in errors
  bool strict_default = false;      // tools that do not say 'strict' (the Responses API: true)
  std::optional<int> think_budget;  // force </think> after this many thinking tokens (Anthropic budget_tokens)
  // Test hooks (accepted only when the server runs with --test-hooks).
  std::optional<std::string> forced_output;  // lily_forced_output
  int step_delay_ms = 0;                     // lily_step_delay_ms
};

// The raw HTTP body -> JSON: valid UTF-8, valid JSON, nested at most kMaxRequestDepth deep
// (deeper documents overflow the stack when copied or rendered). On error returns the ApiError.
inline constexpr size_t kMaxRequestDepth = 64;
inline constexpr int kMaxChoices = 8;  // n
std::optional<ApiError> parse_request_body(std::string_view body, nlohmann::ordered_json& out);

// body: the parsed JSON. On error returns the ApiError; else fills `out`.
std::optional<ApiError> parse_chat_request(const nlohmann::ordered_json& body, bool test_hooks, ApiRequest& out);
std::optional<ApiError> parse_completion_request(const nlohmann::ordered_json& body, bool test_hooks, ApiRequest& out);

// Helpers shared by the request parsers of every API (null counts as absent, as in OpenAI's API).
inline bool present(const nlohmann::ordered_json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }
inline std::optional<ApiError> bad_param(const std::string& param, const std::string& msg) {
  return ApiError::bad_request(msg, param);
}
// The text of a content field: a string, or an array of parts whose type is one of `types` (their
// "text"; "refusal" parts their "refusal"), concatenated onto `out`. `where` names the field.
std::optional<ApiError> text_parts(const nlohmann::ordered_json& content, const std::string& where,
                                   std::initializer_list<std::string_view> types, std::string& out);

// A list of flat tool objects (the Responses API's {type: "function", name, ...}, Anthropic's {name,
// input_schema, ...}) → chat tools [{type: "function", function: {name, description, parameters,
// strict}}]. `types`: the allowed values of "type" ("" : may be absent); `schema_key`: the field
// holding the parameters' JSON schema.
std::optional<ApiError> convert_flat_tools(const nlohmann::ordered_json& tools, std::initializer_list<std::string_view> types,
                                           const char* schema_key, nlohmann::ordered_json& out);

// response_format's object: {"type":"text"|"json_object"|"json_schema", "json_schema":{name, schema,
// strict}}; flat (the Responses API's text.format): name, schema and strict beside type.
std::optional<ApiError> parse_response_format(const nlohmann::ordered_json& f, const std::string& param, bool flat,
                                              ApiRequest& out);

// True when s is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s);

}  // namespace lily
