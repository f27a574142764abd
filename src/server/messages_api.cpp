// The Messages API: see messages_api.h. Like the Responses API, the request is rewritten as a chat
// completions body and validated by the chat parser.
#include "server/messages_api.h"

#include <map>

#include <fmt/format.h>

namespace lily {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

using Err = std::optional<ApiError>;
const auto bad = bad_param;

// Text of a content field: a string or text blocks.
Err block_text(const ojson& c, const std::string& where, std::string& out) { return text_parts(c, where, {"text"}, out); }

Err convert_messages(const ojson& ms, ojson& out) {
  if (!ms.is_array()) return bad("messages", "'messages' must be an array");
  for (size_t i = 0; i < ms.size(); ++i) {
    const ojson& m = ms[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad(where + ".role", fmt::format("'{}.role' must be 'user' or 'assistant'", where));
    const std::string role = m["role"];
    if (role != "user" && role != "assistant") return bad(where + ".role", fmt::format("'{}.role' must be 'user' or 'assistant'", where));
    if (!m.contains("content")) return bad(where + ".content", fmt::format("'{}.content' is required", where));
    const ojson& c = m["content"];
    if (c.is_string()) {
      out.push_back({{"role", role}, {"content", c}});
      continue;
    }
    if (!c.is_array()) return bad(where + ".content", fmt::format("'{}.content' must be a string or an array of blocks", where));
    std::string text, thinking;
    ojson calls = ojson::array();
    for (size_t k = 0; k < c.size(); ++k) {
      const ojson& b = c[k];
      const std::string bw = fmt::format("{}.content[{}]", where, k);
      const std::string type = b.is_object() && b.contains("type") && b["type"].is_string() ? b["type"].get<std::string>() : "";
      if (type == "text") {
        if (!b.contains("text") || !b["text"].is_string()) return bad(bw + ".text", fmt::format("'{}.text' must be a string", bw));
        text += b["text"].get<std::string>();
      } else if (type == "tool_result" && role == "user") {
        if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string())
          return bad(bw + ".tool_use_id", fmt::format("'{}.tool_use_id' must be a string", bw));
        std::string result;
        if (present(b, "content"))
          if (auto e = block_text(b["content"], bw + ".content", result)) return e;
        if (b.value("is_error", false)) result = "Error: " + result;
        out.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
      } else if (type == "tool_use" && role == "assistant") {
        if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string())
          return bad(bw, fmt::format("'{}' needs a string 'id' and 'name'", bw));
        const ojson input = present(b, "input") ? b["input"] : ojson::object();
        if (!input.is_object()) return bad(bw + ".input", fmt::format("'{}.input' must be an object", bw));
        calls.push_back({{"id", b["id"]}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input}}}});
      } else if (type == "thinking" && role == "assistant") {
        if (b.contains("thinking") && b["thinking"].is_string()) thinking += b["thinking"].get<std::string>();
      } else if (type == "redacted_thinking" && role == "assistant") {
        // Opaque to this server: nothing to render.
      } else {
        return bad(bw + ".type", fmt::format("content blocks of type '{}' are not supported in {} messages", type, role));
      }
    }
    if (role == "assistant") {
      ojson a = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) a["reasoning_content"] = thinking;
      if (!calls.empty()) a["tool_calls"] = calls;
      out.push_back(a);
    } else if (!text.empty() || c.empty()) {
      out.push_back({{"role", "user"}, {"content", text}});
    }
  }
  return std::nullopt;
}

}  // namespace

json anthropic_error(const ApiError& e) {
  std::string type = "api_error";
  switch (e.status) {
    case 400: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503:
    case 529: type = "overloaded_error"; break;
    default: break;
  }
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}};
}

Err parse_messages_request(const ojson& b, bool test_hooks, bool count_only, ApiRequest& out) {
  if (!b.is_object()) return bad("", "the request body must be a JSON object");
  if (!present(b, "model") || !b["model"].is_string()) return bad("model", "'model' is required");
  if (!count_only && !present(b, "max_tokens")) return bad("max_tokens", "'max_tokens' is required");
  if (!present(b, "messages")) return bad("messages", "'messages' is required");
  if (present(b, "temperature") && b["temperature"].is_number() && b["temperature"].get<double>() > 1.0)
    return bad("temperature", "'temperature' must be between 0 and 1");
  ojson chat = ojson::object();
  for (const char* k : {"model", "max_tokens", "temperature", "top_p", "top_k", "stream", "metadata", "lily_forced_output",
                        "lily_step_delay_ms"})
    if (b.contains(k)) chat[k] = b[k];
  if (present(b, "stop_sequences")) chat["stop"] = b["stop_sequences"];
  ojson msgs = ojson::array();
  if (present(b, "system")) {
    std::string sys;
    if (auto e = block_text(b["system"], "system", sys)) return e;
    msgs.push_back({{"role", "system"}, {"content", sys}});
  }
  if (auto e = convert_messages(b["messages"], msgs)) return e;
  chat["messages"] = msgs;
  if (present(b, "tools")) {  // custom tools → chat tools (server tools such as bash are refused)
    ojson tools;
    if (auto e = convert_flat_tools(b["tools"], {"", "custom"}, "input_schema", tools)) return e;
    chat["tools"] = tools;
  }
  if (present(b, "tool_choice")) {
    const ojson& c = b["tool_choice"];
    const std::string type = c.is_object() && c.contains("type") && c["type"].is_string() ? c["type"].get<std::string>() : "";
    if (type == "auto" || type == "none") chat["tool_choice"] = type;
    else if (type == "any") chat["tool_choice"] = "required";
    else if (type == "tool" && c.contains("name")) chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    else return bad("tool_choice", "'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"tool\" (with a name) | \"none\"}");
    if (c.contains("disable_parallel_tool_use")) {
      if (!c["disable_parallel_tool_use"].is_boolean())
        return bad("tool_choice.disable_parallel_tool_use", "'tool_choice.disable_parallel_tool_use' must be a boolean");
      chat["parallel_tool_calls"] = !c["disable_parallel_tool_use"].get<bool>();
    }
  }
  // Thinking: off unless enabled (Anthropic's default), on the template's switch.
  bool thinking = false;
  std::optional<int> budget;
  if (present(b, "thinking")) {
    const ojson& t = b["thinking"];
    const std::string type = t.is_object() && t.contains("type") && t["type"].is_string() ? t["type"].get<std::string>() : "";
    if (type == "enabled") {
      thinking = true;
      if (!t.contains("budget_tokens") || !t["budget_tokens"].is_number_integer() || t["budget_tokens"].get<long long>() < 1)
        return bad("thinking.budget_tokens", "'thinking.budget_tokens' must be a positive integer");
      const long long bt = t["budget_tokens"].get<long long>();
      if (!count_only && b["max_tokens"].is_number_integer() && bt >= b["max_tokens"].get<long long>())
        return bad("thinking.budget_tokens", "'thinking.budget_tokens' must be less than 'max_tokens'");
      budget = int(std::min<long long>(bt, INT32_MAX));
    } else if (type == "adaptive") {
      thinking = true;
    } else if (type != "disabled") {
      return bad("thinking.type", "'thinking.type' must be 'enabled', 'adaptive' or 'disabled'");
    }
  }
  chat["chat_template_kwargs"] = {{"enable_thinking", thinking}};
  if (auto e = parse_chat_request(chat, test_hooks, out)) {
    if (e->param == "stop") e->param = "stop_sequences";
    return e;
  }
  out.think_budget = budget;
  if (present(b, "output_format"))
    if (auto e = parse_response_format(b["output_format"], "output_format", true, out)) return e;
  return std::nullopt;
}

// ---- writer ----

MessagesWriter::MessagesWriter(const ReplyParserOptions& parser, std::string model)
    : id_(random_id("msg_")), model_(std::move(model)), parse_(parser) {}

json MessagesWriter::usage_json() const {
  return {{"input_tokens", usage_.prompt_tokens - usage_.cached_tokens},
          {"output_tokens", usage_.completion_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", usage_.cached_tokens}};
}

std::string MessagesWriter::stop_reason() const {
  if (!parse_.all.calls().empty()) return "tool_use";
  if (finish_ == FinishReason::kLength) return "max_tokens";
  if (!parse_.last.stop_string.empty()) return "stop_sequence";
  return "end_turn";
}

static std::string tool_use_id(const std::string& call_id) {
  return "toolu_" + (call_id.rfind("call_", 0) == 0 ? call_id.substr(5) : call_id);
}

void MessagesWriter::close_block(std::vector<std::string>& out) {
  if (open_ == Block::kNone) return;
  out.push_back(sse_event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}}));
  open_ = Block::kNone;
}

std::vector<std::string> MessagesWriter::begin() {
  json msg = {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", json::array()},
              {"stop_reason", nullptr}, {"stop_sequence", nullptr},
              {"usage", {{"input_tokens", 0}, {"output_tokens", 0}}}};
  return {sse_event("message_start", {{"type", "message_start"}, {"message", msg}})};
}

std::vector<std::string> MessagesWriter::on_event(int choice, const GenEvent& ev) {
  std::vector<std::string> out;
  if (choice != 0 || parse_.done) return out;
  record(choice, ev);
  const ReplyDelta d = parse_.feed(ev);
  auto open = [&](Block kind, json block) {
    close_block(out);
    open_ = kind;
    ++index_;
    out.push_back(sse_event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}}));
  };
  for (const auto& it : d.items) {
    switch (it.kind) {
      case ReplyItem::Kind::kReasoning:
        if (open_ != Block::kThinking) open(Block::kThinking, {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
        out.push_back(sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                                        {"delta", {{"type", "thinking_delta"}, {"thinking", it.text}}}}));
        break;
      case ReplyItem::Kind::kContent:
        if (open_ != Block::kText) open(Block::kText, {{"type", "text"}, {"text", ""}});
        out.push_back(sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                                        {"delta", {{"type", "text_delta"}, {"text", it.text}}}}));
        break;
      case ReplyItem::Kind::kCall:
        if (it.begin)
          open(Block::kTool, {{"type", "tool_use"}, {"id", tool_use_id(it.id)}, {"name", it.name}, {"input", json::object()}});
        if (!it.text.empty())
          out.push_back(sse_event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_},
                                                          {"delta", {{"type", "input_json_delta"}, {"partial_json", it.text}}}}));
        if (it.end) close_block(out);
        break;
    }
  }
  if (ev.done && (ev.finish == FinishReason::kStop || ev.finish == FinishReason::kLength)) {
    close_block(out);
    const std::string reason = stop_reason();
    final_.push_back(sse_event("message_delta", {{"type", "message_delta"},
                                                 {"delta", {{"stop_reason", reason},
                                                            {"stop_sequence", reason == "stop_sequence" ? json(parse_.last.stop_string) : json()}}},
                                                 {"usage", usage_json()}}));
    final_.push_back(sse_event("message_stop", {{"type", "message_stop"}}));
  }
  return out;
}

std::vector<std::string> MessagesWriter::end() { return std::move(final_); }

json MessagesWriter::whole() {
  json content = json::array();
  std::map<int, std::pair<size_t, std::string>> calls;  // call index -> (block, arguments)
  for (const auto& it : parse_.all.items) {
    switch (it.kind) {
      case ReplyItem::Kind::kReasoning: content.push_back({{"type", "thinking"}, {"thinking", it.text}, {"signature", ""}}); break;
      case ReplyItem::Kind::kContent: content.push_back({{"type", "text"}, {"text", it.text}}); break;
      case ReplyItem::Kind::kCall:
        if (it.begin) {
          calls[it.call].first = content.size();
          content.push_back({{"type", "tool_use"}, {"id", tool_use_id(it.id)}, {"name", it.name}, {"input", json::object()}});
        }
        calls[it.call].second += it.text;
        break;
    }
  }
  for (const auto& [k, c] : calls) {
    json input = json::parse(c.second, nullptr, false);
    if (input.is_object()) content[c.first]["input"] = input;
  }
  const std::string reason = stop_reason();
  return {{"id", id_}, {"type", "message"}, {"role", "assistant"}, {"model", model_}, {"content", content},
          {"stop_reason", reason}, {"stop_sequence", reason == "stop_sequence" ? json(parse_.last.stop_string) : json()},
          {"usage", usage_json()}};
}

std::string MessagesWriter::error_frame(const ApiError& e) const { return sse_event("error", anthropic_error(e)); }

}  // namespace lily
