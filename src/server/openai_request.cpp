// Validation of OpenAI request bodies: see openai_request.h. Each check names the field, so a
// client learns exactly what to fix; null counts as absent, as in OpenAI's API.
#include "server/openai_request.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/json_depth.h"

namespace lily {

using json = nlohmann::ordered_json;

namespace {

using Err = std::optional<ApiError>;

Err bad(const std::string& param, const std::string& msg) { return bad_param(param, msg); }

Err get_number(const json& b, const char* k, double lo, double hi, std::optional<float>& out) {
  if (!present(b, k)) return std::nullopt;
  if (!b[k].is_number()) return bad(k, fmt::format("'{}' must be a number", k));
  double v = b[k].get<double>();
  if (!(v >= lo && v <= hi)) return bad(k, fmt::format("'{}' must be between {} and {}", k, lo, hi));
  out = float(v);
  return std::nullopt;
}

Err get_int(const json& b, const char* k, long long lo, long long hi, std::optional<long long>& out) {
  if (!present(b, k)) return std::nullopt;
  if (!b[k].is_number_integer()) return bad(k, fmt::format("'{}' must be an integer", k));
  long long v = b[k].is_number_unsigned() ? (long long)std::min<uint64_t>(b[k].get<uint64_t>(), uint64_t(INT64_MAX))
                                          : b[k].get<long long>();
  if (v < lo || v > hi) return bad(k, fmt::format("'{}' must be between {} and {}", k, lo, hi));
  out = v;
  return std::nullopt;
}

Err get_bool(const json& b, const char* k, bool& out) {
  if (!present(b, k)) return std::nullopt;
  if (!b[k].is_boolean()) return bad(k, fmt::format("'{}' must be a boolean", k));
  out = b[k].get<bool>();
  return std::nullopt;
}

Err get_string(const json& b, const char* k, std::string& out) {
  if (!present(b, k)) return std::nullopt;
  if (!b[k].is_string()) return bad(k, fmt::format("'{}' must be a string", k));
  out = b[k].get<std::string>();
  return std::nullopt;
}

Err expect_object(const json& b, const char* k) {
  if (present(b, k) && !b[k].is_object()) return bad(k, fmt::format("'{}' must be an object", k));
  return std::nullopt;
}

#define LILY_API_TRY(expr)       \
  do {                           \
    if (auto _e = (expr)) return _e; \
  } while (0)

// Fields that would change the result but that lily does not implement: refused, not ignored.
Err refuse_unsupported(const json& b) {
  if (present(b, "logit_bias") && !(b["logit_bias"].is_object() && b["logit_bias"].empty()))
    return bad("logit_bias", "'logit_bias' is not supported");
  if (present(b, "best_of") && !(b["best_of"].is_number_integer() && b["best_of"].get<long long>() == 1))
    return bad("best_of", "'best_of' is not supported (use 'n')");
  if (present(b, "echo") && !(b["echo"].is_boolean() && !b["echo"].get<bool>())) return bad("echo", "'echo' is not supported");
  if (present(b, "suffix") && !(b["suffix"].is_string() && b["suffix"].get<std::string>().empty()))
    return bad("suffix", "'suffix' (insertion) is not supported");
  for (const char* k : {"functions", "function_call"})
    if (present(b, k)) return bad(k, fmt::format("'{}' is deprecated and not supported; use 'tools' and 'tool_choice'", k));
  for (const char* k : {"audio", "prediction", "web_search_options"})
    if (present(b, k)) return bad(k, fmt::format("'{}' is not supported", k));
  if (present(b, "modalities")) {
    const json& m = b["modalities"];
    if (!m.is_array()) return bad("modalities", "'modalities' must be an array");
    for (const auto& x : m)
      if (x != "text") return bad("modalities", "only the 'text' modality is supported");
  }
  return std::nullopt;
}

// Fields shared by both endpoints.
Err parse_common(const json& b, bool test_hooks, ApiRequest& r) {
  if (!b.is_object()) return bad("", "the request body must be a JSON object");
  LILY_API_TRY(get_string(b, "model", r.model));
  std::optional<long long> i;
  LILY_API_TRY(get_int(b, "max_tokens", 1, INT32_MAX, i));
  if (i) r.max_tokens = int(*i);
  i.reset();
  LILY_API_TRY(get_int(b, "max_completion_tokens", 1, INT32_MAX, i));
  if (i) r.max_tokens = int(*i);
  LILY_API_TRY(get_number(b, "temperature", 0, 2, r.temperature));
  LILY_API_TRY(get_number(b, "top_p", 0, 1, r.top_p));
  if (r.top_p && *r.top_p <= 0) return bad("top_p", "'top_p' must be greater than 0");
  LILY_API_TRY(get_number(b, "min_p", 0, 1, r.min_p));
  LILY_API_TRY(get_number(b, "presence_penalty", -2, 2, r.presence_penalty));
  LILY_API_TRY(get_number(b, "frequency_penalty", -2, 2, r.frequency_penalty));
  LILY_API_TRY(get_number(b, "repetition_penalty", 0, 100, r.repetition_penalty));
  if (r.repetition_penalty && *r.repetition_penalty <= 0)
    return bad("repetition_penalty", "'repetition_penalty' must be greater than 0");
  i.reset();
  LILY_API_TRY(get_int(b, "top_k", -1, INT32_MAX, i));
  if (i) r.top_k = int(*i);
  i.reset();
  LILY_API_TRY(get_int(b, "seed", INT64_MIN, INT64_MAX, i));
  if (i) r.seed = uint64_t(*i);
  i.reset();
  LILY_API_TRY(get_int(b, "n", 1, kMaxChoices, i));
  if (i) r.n = int(*i);
  if (present(b, "stop")) {
    const json& s = b["stop"];
    if (s.is_string()) {
      r.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 16) return bad("stop", "'stop' may hold at most 16 strings");
      for (const auto& x : s) {
        if (!x.is_string()) return bad("stop", "'stop' must be a string or an array of strings");
        r.stop.push_back(x.get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or an array of strings");
    }
  }
  LILY_API_TRY(get_bool(b, "stream", r.stream));
  LILY_API_TRY(expect_object(b, "stream_options"));
  if (present(b, "stream_options")) LILY_API_TRY(get_bool(b["stream_options"], "include_usage", r.include_usage));
  if (present(b, "response_format")) LILY_API_TRY(parse_response_format(b["response_format"], "response_format", false, r));
  LILY_API_TRY(refuse_unsupported(b));
  std::string user;
  LILY_API_TRY(get_string(b, "user", user));
  LILY_API_TRY(expect_object(b, "metadata"));
  LILY_API_TRY(get_string(b, "prompt_cache_key", r.cache_key));
  // Test hooks: refused unless the server was started for tests.
  for (const char* k : {"lily_forced_output", "lily_step_delay_ms"})
    if (b.contains(k) && !test_hooks)
      return bad(k, fmt::format("'{}' is a test hook; the server was not started with --test-hooks", k));
  std::string forced;
  if (present(b, "lily_forced_output")) {
    LILY_API_TRY(get_string(b, "lily_forced_output", forced));
    r.forced_output = forced;
  }
  i.reset();
  LILY_API_TRY(get_int(b, "lily_step_delay_ms", 0, 10000, i));
  if (i) r.step_delay_ms = int(*i);
  return std::nullopt;
}

Err parse_content(const json& m, size_t idx, const std::string& role) {
  std::string where = fmt::format("messages[{}].content", idx);
  if (!m.contains("content") || m["content"].is_null()) {
    if (role == "assistant") return std::nullopt;  // e.g. a turn with only tool_calls
    return bad(where, fmt::format("'{}' is required for role '{}'", where, role));
  }
  const json& c = m["content"];
  if (c.is_string()) return std::nullopt;
  if (!c.is_array()) return bad(where, fmt::format("'{}' must be a string or an array of content parts", where));
  for (size_t j = 0; j < c.size(); ++j) {
    const json& p = c[j];
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      return bad(where, fmt::format("'{}[{}]' must be a content part object with a 'type'", where, j));
    if (p["type"] != "text")
      return bad(where, fmt::format("'{}[{}]': content parts of type '{}' are not supported; only 'text' is",
                                    where, j, p["type"].get<std::string>()));
    if (!p.contains("text") || !p["text"].is_string())
      return bad(where, fmt::format("'{}[{}].text' must be a string", where, j));
  }
  return std::nullopt;
}

Err parse_messages(const json& b, ApiRequest& r) {
  if (!present(b, "messages")) return bad("messages", "'messages' is required");
  const json& ms = b["messages"];
  if (!ms.is_array()) return bad("messages", "'messages' must be an array");
  if (ms.empty()) return bad("messages", "'messages' must not be empty");
  r.messages = json::array();
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& m = ms[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return bad(where, fmt::format("'{}' must be an object", where));
    if (!m.contains("role") || !m["role"].is_string())
      return bad(where + ".role", fmt::format("'{}.role' must be a string", where));
    std::string role = m["role"];
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")
      return bad(where + ".role", fmt::format("'{}.role' is '{}'; expected system, developer, user, assistant or tool",
                                              where, role));
    LILY_API_TRY(parse_content(m, i, role));
    json out = m;
    if (role == "developer") out["role"] = "system";  // the template knows only system
    if (role == "tool" && present(m, "tool_call_id") && !m["tool_call_id"].is_string())
      return bad(where + ".tool_call_id", fmt::format("'{}.tool_call_id' must be a string", where));
    if (role == "assistant" && present(m, "tool_calls")) {
      const json& tc = m["tool_calls"];
      if (!tc.is_array()) return bad(where + ".tool_calls", fmt::format("'{}.tool_calls' must be an array", where));
      for (size_t j = 0; j < tc.size(); ++j) {
        const json& c = tc[j];
        std::string w = fmt::format("{}.tool_calls[{}]", where, j);
        if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
          return bad(w, fmt::format("'{}' must be an object with a 'function'", w));
        const json& f = c["function"];
        if (!f.contains("name") || !f["name"].is_string())
          return bad(w + ".function.name", fmt::format("'{}.function.name' must be a string", w));
        if (present(f, "arguments") && !f["arguments"].is_string() && !f["arguments"].is_object())
          return bad(w + ".function.arguments", fmt::format("'{}.function.arguments' must be a JSON string", w));
      }
    }
    r.messages.push_back(std::move(out));
  }
  return std::nullopt;
}

Err parse_tools(const json& b, ApiRequest& r) {
  if (present(b, "tools")) {
    const json& t = b["tools"];
    if (!t.is_array()) return bad("tools", "'tools' must be an array");
    for (size_t i = 0; i < t.size(); ++i) {
      std::string w = fmt::format("tools[{}]", i);
      if (!t[i].is_object() || !t[i].contains("function") || !t[i]["function"].is_object())
        return bad(w, fmt::format("'{}' must be an object with a 'function'", w));
      if (present(t[i], "type") && t[i]["type"] != "function")
        return bad(w + ".type", fmt::format("'{}.type' must be 'function'", w));
      const json& f = t[i]["function"];
      if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
        return bad(w + ".function.name", fmt::format("'{}.function.name' must be a non-empty string", w));
      if (present(f, "parameters") && !f["parameters"].is_object())
        return bad(w + ".function.parameters", fmt::format("'{}.function.parameters' must be an object", w));
      if (present(f, "strict") && !f["strict"].is_boolean())
        return bad(w + ".function.strict", fmt::format("'{}.function.strict' must be a boolean", w));
    }
    if (!t.empty()) r.tools = t;
  }
  if (present(b, "tool_choice")) {
    const json& c = b["tool_choice"];
    if (c.is_string()) {
      r.tool_choice = c.get<std::string>();
      if (r.tool_choice != "auto" && r.tool_choice != "none" && r.tool_choice != "required")
        return bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a named function");
    } else if (c.is_object() && c.contains("function") && c["function"].is_object() &&
               c["function"].contains("name") && c["function"]["name"].is_string()) {
      r.tool_choice = "function";
      r.tool_choice_name = c["function"]["name"];
      bool found = false;
      if (r.tools.is_array())
        for (const auto& t : r.tools) found = found || t["function"]["name"] == r.tool_choice_name;
      if (!found)
        return bad("tool_choice", fmt::format("tool_choice names '{}', which is not in 'tools'", r.tool_choice_name));
    } else {
      return bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a named function");
    }
    if (r.tool_choice == "required" && !r.tools.is_array())
      return bad("tool_choice", "tool_choice 'required' needs a non-empty 'tools'");
  }
  LILY_API_TRY(get_bool(b, "parallel_tool_calls", r.parallel_tool_calls));
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_request_body(std::string_view body, json& out) {
  if (!valid_utf8(body)) return ApiError::bad_request("The request body is not valid UTF-8", "", "invalid_utf8");
  if (json_nesting_depth(body) > kMaxRequestDepth)
    return ApiError::bad_request(fmt::format("The request body nests deeper than {} levels", kMaxRequestDepth), "",
                                 "invalid_json");
  out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out.is_discarded())
    return ApiError::bad_request("We could not parse the JSON body of your request: it is not valid JSON", "",
                                 "invalid_json");
  return std::nullopt;
}

std::optional<ApiError> text_parts(const json& content, const std::string& where,
                                   std::initializer_list<std::string_view> types, std::string& out) {
  if (content.is_string()) {
    out += content.get<std::string>();
    return std::nullopt;
  }
  if (!content.is_array()) return bad(where, fmt::format("'{}' must be a string or an array of content parts", where));
  for (size_t k = 0; k < content.size(); ++k) {
    const json& p = content[k];
    const std::string type = p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>() : "";
    if (std::find(types.begin(), types.end(), type) == types.end())
      return bad(where, fmt::format("'{}[{}]': parts of type '{}' are not supported here (text only)", where, k, type));
    const char* key = type == "refusal" ? "refusal" : "text";
    if (!p.contains(key) || !p[key].is_string()) return bad(where, fmt::format("'{}[{}].{}' must be a string", where, k, key));
    out += p[key].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> convert_flat_tools(const json& tools, std::initializer_list<std::string_view> types,
                                           const char* schema_key, json& out) {
  if (!tools.is_array()) return bad("tools", "'tools' must be an array");
  out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string w = fmt::format("tools[{}]", i);
    if (!t.is_object()) return bad(w, fmt::format("'{}' must be an object", w));
    const std::string type = t.contains("type") && t["type"].is_string() ? t["type"].get<std::string>() : (present(t, "type") ? "?" : "");
    if (std::find(types.begin(), types.end(), type) == types.end())
      return bad(w + ".type", fmt::format("tools of type '{}' are not supported here; only function tools", type));
    json f = json::object();
    for (const char* k : {"name", "description", "strict"})
      if (t.contains(k)) f[k] = t[k];
    if (t.contains(schema_key)) f["parameters"] = t[schema_key];
    out.push_back({{"type", "function"}, {"function", f}});
  }
  return std::nullopt;
}

std::optional<ApiError> parse_response_format(const json& f, const std::string& param, bool flat, ApiRequest& r) {
  r.format_param = param;
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    return bad(param, fmt::format("'{}' must be an object with a string 'type'", param));
  const std::string type = f["type"];
  if (type == "text") {
    r.format = ApiRequest::Format::kText;
    return std::nullopt;
  }
  if (type == "json_object") {
    r.format = ApiRequest::Format::kJsonObject;
    return std::nullopt;
  }
  if (type != "json_schema")
    return bad(param + ".type", fmt::format("'{}.type' must be 'text', 'json_object' or 'json_schema'", param));
  const json* spec = &f;
  std::string where = param;
  if (!flat) {
    if (!present(f, "json_schema") || !f["json_schema"].is_object())
      return bad(param + ".json_schema", fmt::format("'{}.json_schema' must be an object with the 'schema'", param));
    spec = &f["json_schema"];
    where += ".json_schema";
  }
  if (present(*spec, "name") && !(*spec)["name"].is_string()) return bad(where + ".name", fmt::format("'{}.name' must be a string", where));
  if (present(*spec, "strict") && !(*spec)["strict"].is_boolean())
    return bad(where + ".strict", fmt::format("'{}.strict' must be a boolean", where));
  if (!present(*spec, "schema")) return bad(where + ".schema", fmt::format("'{}.schema' is required", where));
  const json& schema = (*spec)["schema"];
  if (!schema.is_object() && !schema.is_boolean())
    return bad(where + ".schema", fmt::format("'{}.schema' must be a JSON schema (an object)", where));
  r.format = ApiRequest::Format::kJsonSchema;
  r.format_schema = schema;
  r.format_name = spec->value("name", "");
  return std::nullopt;
}

std::optional<ApiError> parse_chat_request(const json& b, bool test_hooks, ApiRequest& r) {
  r = ApiRequest{};
  r.chat = true;
  LILY_API_TRY(parse_common(b, test_hooks, r));
  LILY_API_TRY(parse_messages(b, r));
  LILY_API_TRY(parse_tools(b, r));
  LILY_API_TRY(get_bool(b, "logprobs", r.logprobs));
  std::optional<long long> i;
  LILY_API_TRY(get_int(b, "top_logprobs", 0, 20, i));
  if (i) {
    if (!r.logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    r.top_logprobs = int(*i);
  }
  std::string effort;
  LILY_API_TRY(get_string(b, "reasoning_effort", effort));
  if (!effort.empty()) {
    if (effort != "none" && effort != "minimal" && effort != "low" && effort != "medium" && effort != "high")
      return bad("reasoning_effort", "'reasoning_effort' must be none, minimal, low, medium or high");
    r.enable_thinking = effort != "none" && effort != "minimal";  // thinking is on or off; no levels
  }
  LILY_API_TRY(expect_object(b, "chat_template_kwargs"));
  if (present(b, "chat_template_kwargs")) {
    r.template_kwargs = b["chat_template_kwargs"];
    bool think = true;
    if (present(r.template_kwargs, "enable_thinking")) {
      if (!r.template_kwargs["enable_thinking"].is_boolean())
        return bad("chat_template_kwargs.enable_thinking", "'chat_template_kwargs.enable_thinking' must be a boolean");
      think = r.template_kwargs["enable_thinking"];
      r.enable_thinking = think;
    }
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const json& b, bool test_hooks, ApiRequest& r) {
  r = ApiRequest{};
  r.chat = false;
  LILY_API_TRY(parse_common(b, test_hooks, r));
  if (!present(b, "prompt")) return bad("prompt", "'prompt' is required");
  const json& p = b["prompt"];
  if (p.is_string()) r.prompt = p.get<std::string>();
  else if (p.is_array() && p.size() == 1 && p[0].is_string()) r.prompt = p[0].get<std::string>();
  else return bad("prompt", "'prompt' must be a string (batches of prompts are not supported)");
  if (r.prompt.empty()) return bad("prompt", "'prompt' must not be empty");
  std::optional<long long> i;
  LILY_API_TRY(get_int(b, "logprobs", 0, 5, i));
  if (i) {
    r.logprobs = true;
    r.top_logprobs = int(*i);
  }
  return std::nullopt;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    unsigned c = u[i];
    if (c < 0x80) { ++i; continue; }
    int n;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size() || (u[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (u[i + k] & 0x3F);
    }
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(n) + 1;
  }
  return true;
}

}  // namespace lily
