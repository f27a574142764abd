// The Responses API: see responses_api.h. The request is rewritten as a chat completions body and
// validated by the chat parser (one set of rules for sampling fields, tools and messages); errors
// name the Responses field where the chat field differs.
#include "server/responses_api.h"

#include <chrono>

#include <fmt/format.h>

namespace lily {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// ---- store ----

void ResponseStore::put(const std::string& id, StoredResponse r) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = items_.find(id); it != items_.end()) {
    order_.erase(it->second.second);
    items_.erase(it);
  }
  order_.push_front(id);
  items_.emplace(id, std::make_pair(std::move(r), order_.begin()));
  while (items_.size() > capacity_) {
    items_.erase(order_.back());
    order_.pop_back();
  }
}

std::optional<StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = items_.find(id);
  if (it == items_.end()) return std::nullopt;
  order_.splice(order_.begin(), order_, it->second.second);
  return it->second.first;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = items_.find(id);
  if (it == items_.end()) return false;
  order_.erase(it->second.second);
  items_.erase(it);
  return true;
}

// ---- request ----

namespace {

using Err = std::optional<ApiError>;
const auto bad = bad_param;

Err part_text(const ojson& content, const std::string& where, std::string& out) {
  return text_parts(content, where, {"input_text", "output_text", "text", "refusal"}, out);
}

// Input items → chat messages, appended to `msgs`.
Err convert_input(const ojson& input, ojson& msgs) {
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return bad("input", "'input' must be a string or an array of items");
  std::string reasoning;  // a reasoning item goes with the assistant turn that follows it
  bool have_reasoning = false;
  auto assistant = [&]() -> ojson& {
    if (msgs.empty() || msgs.back()["role"] != "assistant" || have_reasoning) {
      msgs.push_back({{"role", "assistant"}, {"content", ""}});
      if (have_reasoning) msgs.back()["reasoning_content"] = reasoning;
      have_reasoning = false;
      reasoning.clear();
    }
    return msgs.back();
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& it = input[i];
    const std::string where = fmt::format("input[{}]", i);
    if (!it.is_object()) return bad(where, fmt::format("'{}' must be an object", where));
    std::string type = it.contains("type") && it["type"].is_string() ? it["type"].get<std::string>() : "";
    if (type.empty() && it.contains("role")) type = "message";
    if (type == "message") {
      if (!it.contains("role") || !it["role"].is_string()) return bad(where + ".role", fmt::format("'{}.role' must be a string", where));
      const std::string role = it["role"];
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad(where + ".role", fmt::format("'{}.role' must be user, assistant, system or developer", where));
      std::string text;
      if (!it.contains("content")) return bad(where + ".content", fmt::format("'{}.content' is required", where));
      if (auto e = part_text(it["content"], where + ".content", text)) return e;
      if (role == "assistant") assistant()["content"] = assistant()["content"].get<std::string>() + text;
      else msgs.push_back({{"role", role == "developer" ? "system" : role}, {"content", text}});
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!it.contains(k) || !it[k].is_string()) return bad(where + "." + k, fmt::format("'{}.{}' must be a string", where, k));
      ojson& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      m["tool_calls"].push_back({{"id", it["call_id"]}, {"type", "function"},
                                 {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}});
    } else if (type == "function_call_output") {
      if (!it.contains("call_id") || !it["call_id"].is_string())
        return bad(where + ".call_id", fmt::format("'{}.call_id' must be a string", where));
      std::string out;
      if (!it.contains("output")) return bad(where + ".output", fmt::format("'{}.output' is required", where));
      if (auto e = part_text(it["output"], where + ".output", out)) return e;
      msgs.push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", out}});
    } else if (type == "reasoning") {
      std::string text;
      for (const char* k : {"content", "summary"})
        if (present(it, k) && it[k].is_array())
          for (const auto& p : it[k])
            if (p.is_object() && p.contains("text") && p["text"].is_string()) text += p["text"].get<std::string>();
      reasoning += text;
      have_reasoning = true;
    } else {
      return bad(where + ".type", fmt::format("input items of type '{}' are not supported", type.empty() ? "(none)" : type));
    }
  }
  return std::nullopt;
}

}  // namespace

Err parse_responses_request(const ojson& b, bool test_hooks, ResponseStore& store, ApiRequest& out, ResponsesContext& ctx) {
  if (!b.is_object()) return bad("", "the request body must be a JSON object");
  for (const char* k : {"background", "conversation", "prompt"})
    if (present(b, k) && !(b[k].is_boolean() && !b[k].get<bool>())) return bad(k, fmt::format("'{}' is not supported", k));
  ctx.body = b;
  ojson chat = ojson::object();
  for (const char* k : {"model", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                        "repetition_penalty", "seed", "stream", "parallel_tool_calls", "prompt_cache_key", "user",
                        "metadata", "stream_options", "logit_bias", "lily_forced_output", "lily_step_delay_ms"})
    if (b.contains(k)) chat[k] = b[k];
  if (present(b, "max_output_tokens")) chat["max_tokens"] = b["max_output_tokens"];
  if (present(b, "store")) {
    if (!b["store"].is_boolean()) return bad("store", "'store' must be a boolean");
    ctx.store = b["store"];
  }
  // The conversation: the previous response's, then this input.
  ojson msgs = ojson::array();
  if (present(b, "previous_response_id")) {
    if (!b["previous_response_id"].is_string()) return bad("previous_response_id", "'previous_response_id' must be a string");
    ctx.previous_id = b["previous_response_id"];
    auto prev = store.get(ctx.previous_id);
    if (!prev)
      return ApiError{400, fmt::format("Previous response with id '{}' not found.", ctx.previous_id), "invalid_request_error",
                      "previous_response_id", "previous_response_not_found"};
    msgs = prev->conversation;
    ctx.chain = prev->chain;
  }
  if (!present(b, "input")) return bad("input", "'input' is required");
  if (auto e = convert_input(b["input"], msgs)) return e;
  ctx.conversation = msgs;
  if (present(b, "instructions")) {
    if (!b["instructions"].is_string()) return bad("instructions", "'instructions' must be a string");
    msgs.insert(msgs.begin(), ojson{{"role", "system"}, {"content", b["instructions"]}});
  }
  chat["messages"] = msgs;
  if (present(b, "tools")) {  // flat function tools → chat tools
    ojson tools;
    if (auto e = convert_flat_tools(b["tools"], {"function"}, "parameters", tools)) return e;
    chat["tools"] = tools;
  }
  if (present(b, "tool_choice")) {
    const ojson& c = b["tool_choice"];
    if (c.is_object() && c.value("type", "") == "function" && c.contains("name")) chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", c["name"]}}}};
    else if (c.is_string()) chat["tool_choice"] = c;
    else return bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or {\"type\":\"function\",\"name\":...}");
  }
  if (present(b, "reasoning")) {
    const ojson& r = b["reasoning"];
    if (!r.is_object()) return bad("reasoning", "'reasoning' must be an object");
    if (present(r, "effort")) {
      if (!r["effort"].is_string()) return bad("reasoning.effort", "'reasoning.effort' must be a string");
      chat["reasoning_effort"] = r["effort"];
    }
  }
  if (auto e = parse_chat_request(chat, test_hooks, out)) {
    if (e->param == "max_tokens") e->param = "max_output_tokens";
    if (e->param.rfind("messages", 0) == 0) e->param = "input";
    if (e->param == "reasoning_effort") e->param = "reasoning.effort";
    return e;
  }
  out.strict_default = true;  // the Responses API's function tools are strict unless they say otherwise
  if (present(b, "text")) {
    const ojson& t = b["text"];
    if (!t.is_object()) return bad("text", "'text' must be an object");
    if (present(t, "format"))
      if (auto e = parse_response_format(t["format"], "text.format", true, out)) return e;
  }
  if (ctx.chain.empty()) ctx.chain = random_id("resp_");
  if (out.cache_key.empty()) out.cache_key = "responses:" + ctx.chain;
  return std::nullopt;
}

// ---- writer ----

ResponsesWriter::ResponsesWriter(const ApiRequest& req, const ReplyParserOptions& parser, std::string model,
                                 ResponsesContext ctx)
    : id_(ctx.previous_id.empty() ? ctx.chain : random_id("resp_")),
      model_(std::move(model)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
      ctx_(std::move(ctx)),
      parse_(parser) {}

json ResponsesWriter::response(const std::string& status) const {
  const ojson& b = ctx_.body;
  auto echo = [&](const char* k, json dflt) { return b.contains(k) && !b[k].is_null() ? json(b[k]) : dflt; };
  json r = {{"id", id_}, {"object", "response"}, {"created_at", created_}, {"status", status}, {"error", nullptr},
            {"incomplete_details", nullptr}, {"instructions", echo("instructions", nullptr)},
            {"max_output_tokens", echo("max_output_tokens", nullptr)}, {"model", model_}, {"output", output_},
            {"parallel_tool_calls", echo("parallel_tool_calls", true)},
            {"previous_response_id", ctx_.previous_id.empty() ? json() : json(ctx_.previous_id)},
            {"reasoning", echo("reasoning", json{{"effort", nullptr}, {"summary", nullptr}})},
            {"store", ctx_.store}, {"temperature", echo("temperature", 1.0)},
            {"text", echo("text", json{{"format", {{"type", "text"}}}})}, {"tool_choice", echo("tool_choice", "auto")},
            {"tools", echo("tools", json::array())}, {"top_p", echo("top_p", 1.0)}, {"truncation", echo("truncation", "disabled")},
            {"usage", nullptr}, {"user", echo("user", nullptr)}, {"metadata", echo("metadata", json::object())}};
  if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (status != "in_progress") {
    r["usage"] = {{"input_tokens", usage_.prompt_tokens},
                  {"input_tokens_details", {{"cached_tokens", usage_.cached_tokens}}},
                  {"output_tokens", usage_.completion_tokens},
                  {"output_tokens_details", {{"reasoning_tokens", parse_.reasoning_tokens}}},
                  {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens}};
    std::string text;
    for (const auto& it : output_)
      if (it["type"] == "message")
        for (const auto& c : it["content"]) text += c.value("text", "");
    r["output_text"] = text;
  }
  return r;
}

json ResponsesWriter::frame(const std::string& type, json fields) {
  fields["type"] = type;
  fields["sequence_number"] = seq_++;
  return fields;
}

int ResponsesWriter::add_item(json item, std::vector<std::string>& out) {
  output_.push_back(item);
  const int idx = int(output_.size()) - 1;
  out.push_back(sse_event("response.output_item.added", frame("response.output_item.added", {{"output_index", idx}, {"item", item}})));
  return idx;
}

void ResponsesWriter::close_open(std::vector<std::string>& out) {
  if (open_ < 0) return;
  json& item = output_[size_t(open_)];
  const std::string iid = item["id"];
  json& part = item["content"][0];
  if (item["type"] == "reasoning") {
    out.push_back(sse_event("response.reasoning_text.done", frame("response.reasoning_text.done",
        {{"item_id", iid}, {"output_index", open_}, {"content_index", 0}, {"text", part["text"]}})));
  } else {
    out.push_back(sse_event("response.output_text.done", frame("response.output_text.done",
        {{"item_id", iid}, {"output_index", open_}, {"content_index", 0}, {"text", part["text"]}, {"logprobs", json::array()}})));
  }
  out.push_back(sse_event("response.content_part.done", frame("response.content_part.done",
      {{"item_id", iid}, {"output_index", open_}, {"content_index", 0}, {"part", part}})));
  item["status"] = "completed";
  out.push_back(sse_event("response.output_item.done", frame("response.output_item.done", {{"output_index", open_}, {"item", item}})));
  open_ = -1;
}

std::vector<std::string> ResponsesWriter::begin() {
  const json r = response("in_progress");
  return {sse_event("response.created", frame("response.created", {{"response", r}})),
          sse_event("response.in_progress", frame("response.in_progress", {{"response", r}}))};
}

std::vector<std::string> ResponsesWriter::on_event(int choice, const GenEvent& ev) {
  std::vector<std::string> out;
  if (choice != 0 || parse_.done) return out;
  record(choice, ev);
  const ReplyDelta d = parse_.feed(ev);
  for (const auto& it : d.items) {
    if (it.kind == ReplyItem::Kind::kCall) {
      if (it.begin) {
        close_open(out);
        json item = {{"type", "function_call"}, {"id", random_id("fc_")}, {"call_id", it.id}, {"name", it.name},
                     {"arguments", ""}, {"status", "in_progress"}};
        call_item_[it.call] = add_item(item, out);
      }
      const int idx = call_item_[it.call];
      json& item = output_[size_t(idx)];
      item["arguments"] = item["arguments"].get<std::string>() + it.text;
      if (!it.text.empty())
        out.push_back(sse_event("response.function_call_arguments.delta", frame("response.function_call_arguments.delta",
            {{"item_id", item["id"]}, {"output_index", idx}, {"delta", it.text}})));
      if (it.end) {
        out.push_back(sse_event("response.function_call_arguments.done", frame("response.function_call_arguments.done",
            {{"item_id", item["id"]}, {"output_index", idx}, {"name", item["name"]}, {"arguments", item["arguments"]}})));
        item["status"] = "completed";
        out.push_back(sse_event("response.output_item.done", frame("response.output_item.done", {{"output_index", idx}, {"item", item}})));
      }
      continue;
    }
    const bool reasoning = it.kind == ReplyItem::Kind::kReasoning;
    const char* want = reasoning ? "reasoning" : "message";
    if (open_ < 0 || output_[size_t(open_)]["type"] != want) {
      close_open(out);
      json item = reasoning ? json{{"type", "reasoning"}, {"id", random_id("rs_")}, {"summary", json::array()}, {"content", json::array()}}
                            : json{{"type", "message"}, {"id", random_id("msg_")}, {"status", "in_progress"},
                                   {"role", "assistant"}, {"content", json::array()}};
      open_ = add_item(item, out);
      json part = reasoning ? json{{"type", "reasoning_text"}, {"text", ""}}
                            : json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}};
      output_[size_t(open_)]["content"].push_back(part);
      out.push_back(sse_event("response.content_part.added", frame("response.content_part.added",
          {{"item_id", output_[size_t(open_)]["id"]}, {"output_index", open_}, {"content_index", 0}, {"part", part}})));
    }
    json& part = output_[size_t(open_)]["content"][0];
    part["text"] = part["text"].get<std::string>() + it.text;
    json f = {{"item_id", output_[size_t(open_)]["id"]}, {"output_index", open_}, {"content_index", 0}, {"delta", it.text}};
    if (!reasoning) f["logprobs"] = json::array();
    const std::string type = reasoning ? "response.reasoning_text.delta" : "response.output_text.delta";
    out.push_back(sse_event(type, frame(type, f)));
  }
  if (ev.done && (ev.finish == FinishReason::kStop || ev.finish == FinishReason::kLength)) {
    close_open(out);
    const bool incomplete = ev.finish == FinishReason::kLength;
    const std::string type = incomplete ? "response.incomplete" : "response.completed";
    final_.push_back(sse_event(type, frame(type, {{"response", response(incomplete ? "incomplete" : "completed")}})));
  }
  return out;
}

std::vector<std::string> ResponsesWriter::end() { return std::move(final_); }

json ResponsesWriter::whole() { return response(finish_ == FinishReason::kLength ? "incomplete" : "completed"); }

std::string ResponsesWriter::error_frame(const ApiError& e) const {
  json r = response("failed");
  r["error"] = {{"code", e.code.empty() ? "server_error" : e.code}, {"message", e.message}};
  return sse_event("response.failed", {{"type", "response.failed"}, {"sequence_number", seq_}, {"response", r}});
}

StoredResponse ResponsesWriter::stored() {
  StoredResponse s;
  s.response = whole();
  s.chain = ctx_.chain;
  s.conversation = ctx_.conversation;
  // The output as the assistant turn the template renders back.
  ojson turn = {{"role", "assistant"}, {"content", parse_.all.content()}};
  const std::string reasoning = parse_.all.reasoning();
  if (!reasoning.empty()) turn["reasoning_content"] = reasoning;
  const auto calls = parse_.all.calls();
  if (!calls.empty()) {
    turn["tool_calls"] = ojson::array();
    for (const auto& c : calls)
      turn["tool_calls"].push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  s.conversation.push_back(turn);
  return s;
}

}  // namespace lily
