// ResponseBuilder: see response_builder.h. Logprobs for tokens whose text is held back still
// go out with the chunk of their step, as OpenAI attaches them per token, not per text.
#include "server/response_builder.h"

#include <chrono>
#include <random>

namespace lily {

using nlohmann::json;

std::string sse_data(const json& j) { return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n"; }

static std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

ResponseBuilder::ResponseBuilder(const ApiRequest& req, const ReplyParserOptions& parser, std::string model,
                                 const Tokenizer& tok)
    : chat_(req.chat),
      stream_usage_(req.include_usage),
      logprobs_(req.logprobs),
      id_(random_id(req.chat ? "chatcmpl-" : "cmpl-")),
      model_(std::move(model)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
      tok_(tok),
      parser_(parser) {
  if (chat_) logprobs_acc_ = json::array();
  else logprobs_acc_ = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                        {"text_offset", json::array()}};
}

std::string ResponseBuilder::token_text(int32_t id) const { return tok_.decode(std::span<const int32_t>(&id, 1), false); }

json ResponseBuilder::logprob_entries(const std::vector<GenToken>& toks) const {
  json arr = json::array();
  auto bytes_of = [&](int32_t id) {
    json b = json::array();
    if (const std::string* s = tok_.token_bytes(id))
      for (unsigned char c : *s) b.push_back(int(c));
    return b;
  };
  for (const auto& t : toks) {
    if (!t.logprob) continue;
    json top = json::array();
    for (const auto& a : t.top) top.push_back({{"token", token_text(a.id)}, {"logprob", a.logprob}, {"bytes", bytes_of(a.id)}});
    arr.push_back({{"token", token_text(t.id)}, {"logprob", *t.logprob}, {"bytes", bytes_of(t.id)}, {"top_logprobs", top}});
  }
  return arr;
}

void ResponseBuilder::add_completion_logprobs(const std::vector<GenToken>& toks) {
  for (const auto& t : toks) {
    if (!t.logprob) continue;
    json top = json::object();
    for (const auto& a : t.top) top[token_text(a.id)] = a.logprob;
    logprobs_acc_["tokens"].push_back(token_text(t.id));
    logprobs_acc_["token_logprobs"].push_back(*t.logprob);
    logprobs_acc_["top_logprobs"].push_back(top);
    logprobs_acc_["text_offset"].push_back(0);
  }
}

std::string ResponseBuilder::finish_reason() const {
  if (finish_ == FinishReason::kLength) return "length";
  if (chat_ && !calls_.empty()) return "tool_calls";
  return "stop";
}

json ResponseBuilder::usage_json() const {
  json u = {{"prompt_tokens", usage_.prompt_tokens},
            {"completion_tokens", usage_.completion_tokens},
            {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", usage_.cached_tokens}}}};
  if (chat_) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning_tokens_}};
  return u;
}

json ResponseBuilder::chunk(json delta_or_text, const json& finish) const {
  json choice = {{"index", 0}};
  if (chat_) choice["delta"] = std::move(delta_or_text);
  else choice["text"] = std::move(delta_or_text);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish;
  json c = {{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
            {"model", model_}, {"system_fingerprint", "lily"}, {"choices", json::array({choice})}};
  if (stream_usage_) c["usage"] = nullptr;
  return c;
}

std::vector<json> ResponseBuilder::on_event(const GenEvent& ev) {
  std::vector<json> out;
  if (done_) return out;
  if (chat_ && !started_) out.push_back(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
  started_ = true;
  // Tokens of this step count as reasoning while the parser is inside the think block.
  if (parser_.in_reasoning()) reasoning_tokens_ += int(ev.tokens.size());
  ReplyDelta d = parser_.push(ev.text);
  if (ev.done) d.append(parser_.flush());
  reasoning_ += d.reasoning;
  content_ += d.content;
  json lp = json();
  if (logprobs_) {
    if (chat_) {
      json e = logprob_entries(ev.tokens);
      for (auto& x : e) logprobs_acc_.push_back(x);
      if (!e.empty()) lp = {{"content", e}};
    } else {
      size_t before = logprobs_acc_["tokens"].size();
      add_completion_logprobs(ev.tokens);
      if (logprobs_acc_["tokens"].size() > before) {
        lp = json::object();
        for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          lp[k] = json(std::vector<json>(logprobs_acc_[k].begin() + long(before), logprobs_acc_[k].end()));
      }
    }
  }
  auto attach = [&](json c) {
    if (!lp.is_null()) {
      c["choices"][0]["logprobs"] = lp;
      lp = json();
    }
    out.push_back(std::move(c));
  };
  if (chat_) {
    if (!d.reasoning.empty()) attach(chunk({{"reasoning_content", d.reasoning}}, nullptr));
    if (!d.content.empty()) attach(chunk({{"content", d.content}}, nullptr));
    for (auto& c : d.calls) {
      json tc = {{"index", int(calls_.size())}, {"id", c.id}, {"type", "function"},
                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
      calls_.push_back(std::move(c));
      attach(chunk({{"tool_calls", json::array({tc})}}, nullptr));
    }
  } else if (!d.content.empty()) {
    attach(chunk(d.content, nullptr));
  }
  if (ev.done) {
    done_ = true;
    finish_ = ev.finish;
    usage_ = ev.usage;
    attach(chunk(chat_ ? json::object() : json(""), finish_reason()));
    if (stream_usage_) {
      json u = {{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
                {"model", model_}, {"system_fingerprint", "lily"}, {"choices", json::array()}, {"usage", usage_json()}};
      out.push_back(std::move(u));
    }
  } else if (!lp.is_null()) {
    attach(chunk(chat_ ? json::object() : json(""), nullptr));  // logprobs of held-back text
  }
  return out;
}

json ResponseBuilder::whole() const {
  json choice = {{"index", 0}};
  if (chat_) {
    json msg = {{"role", "assistant"}, {"content", content_.empty() && !calls_.empty() ? json() : json(content_)}};
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
      json tcs = json::array();
      for (const auto& c : calls_)
        tcs.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      msg["tool_calls"] = tcs;
    }
    choice["message"] = msg;
    choice["logprobs"] = logprobs_ ? json{{"content", logprobs_acc_}} : json();
  } else {
    choice["text"] = content_;
    choice["logprobs"] = logprobs_ ? logprobs_acc_ : json();
  }
  choice["finish_reason"] = finish_reason();
  return {{"id", id_}, {"object", chat_ ? "chat.completion" : "text_completion"}, {"created", created_},
          {"model", model_}, {"system_fingerprint", "lily"}, {"choices", json::array({choice})}, {"usage", usage_json()}};
}

}  // namespace lily
