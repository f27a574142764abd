// OpenAIWriter: see openai_writer.h. Logprobs for tokens whose text is held back still go out
// with the chunk of their step, as OpenAI attaches them per token, not per text.
#include "server/openai_writer.h"

#include <chrono>

namespace lily {

using nlohmann::json;

OpenAIWriter::OpenAIWriter(const ApiRequest& req, const ReplyParserOptions& parser, std::string model, const Tokenizer& tok)
    : chat_(req.chat),
      stream_usage_(req.include_usage),
      logprobs_(req.logprobs),
      id_(random_id(req.chat ? "chatcmpl-" : "cmpl-")),
      model_(std::move(model)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()),
      tok_(tok) {
  for (int i = 0; i < std::max(1, req.n); ++i) {
    ReplyParserOptions o = parser;
    o.id_seed = parser.id_seed + uint64_t(i) * 0x9e3779b97f4a7c15ull;  // distinct call ids per choice
    choices_.emplace_back(o);
    choices_.back().logprobs = chat_ ? json::array()
                                     : json{{"tokens", json::array()}, {"token_logprobs", json::array()},
                                            {"top_logprobs", json::array()}, {"text_offset", json::array()}};
  }
}

std::string OpenAIWriter::token_text(int32_t id) const { return tok_.decode(std::span<const int32_t>(&id, 1), false); }

json OpenAIWriter::logprob_entries(const std::vector<GenToken>& toks) const {
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

json OpenAIWriter::completion_logprobs(Choice& c, const std::vector<GenToken>& toks) const {
  json part = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
               {"text_offset", json::array()}};
  for (const auto& t : toks) {
    if (!t.logprob) continue;
    json top = json::object();
    for (const auto& a : t.top) top[token_text(a.id)] = a.logprob;
    for (json* dst : {&part, &c.logprobs}) {
      (*dst)["tokens"].push_back(token_text(t.id));
      (*dst)["token_logprobs"].push_back(*t.logprob);
      (*dst)["top_logprobs"].push_back(top);
      (*dst)["text_offset"].push_back(0);
    }
  }
  return part["tokens"].empty() ? json() : part;
}

std::string OpenAIWriter::finish_reason(const Choice& c) const {
  if (c.parse.last.finish == FinishReason::kLength) return "length";
  if (chat_ && !c.parse.all.calls().empty()) return "tool_calls";
  return "stop";
}

json OpenAIWriter::usage_json() const {
  int reasoning = 0;
  for (const auto& c : choices_) reasoning += c.parse.reasoning_tokens;
  json u = {{"prompt_tokens", usage_.prompt_tokens},
            {"completion_tokens", usage_.completion_tokens},
            {"total_tokens", usage_.prompt_tokens + usage_.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", usage_.cached_tokens}}}};
  if (chat_) u["completion_tokens_details"] = {{"reasoning_tokens", reasoning}};
  return u;
}

json OpenAIWriter::chunk(int index, json delta_or_text, const json& finish) const {
  json choice = {{"index", index}};
  if (chat_) choice["delta"] = std::move(delta_or_text);
  else choice["text"] = std::move(delta_or_text);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = finish;
  json c = {{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
            {"model", model_}, {"system_fingerprint", "lily"}, {"choices", json::array({choice})}};
  if (stream_usage_) c["usage"] = nullptr;
  return c;
}

std::vector<std::string> OpenAIWriter::on_event(int index, const GenEvent& ev) {
  std::vector<std::string> out;
  if (index < 0 || size_t(index) >= choices_.size()) return out;
  Choice& c = choices_[size_t(index)];
  if (c.parse.done) return out;
  record(index, ev);
  if (chat_ && !c.started) out.push_back(sse_data(chunk(index, {{"role", "assistant"}, {"content", ""}}, nullptr)));
  c.started = true;
  const ReplyDelta d = c.parse.feed(ev);
  json lp;
  if (logprobs_) {
    if (chat_) {
      json e = logprob_entries(ev.tokens);
      for (auto& x : e) c.logprobs.push_back(x);
      if (!e.empty()) lp = {{"content", e}};
    } else {
      lp = completion_logprobs(c, ev.tokens);
    }
  }
  auto emit = [&](json ch) {
    if (!lp.is_null()) {
      ch["choices"][0]["logprobs"] = lp;
      lp = json();
    }
    out.push_back(sse_data(ch));
  };
  for (const auto& it : d.items) {
    switch (it.kind) {
      case ReplyItem::Kind::kReasoning: emit(chunk(index, {{"reasoning_content", it.text}}, nullptr)); break;
      case ReplyItem::Kind::kContent: emit(chunk(index, chat_ ? json{{"content", it.text}} : json(it.text), nullptr)); break;
      case ReplyItem::Kind::kCall: {
        json tc = {{"index", it.call}};
        if (it.begin) tc["id"] = it.id, tc["type"] = "function", tc["function"] = {{"name", it.name}, {"arguments", it.text}};
        else tc["function"] = {{"arguments", it.text}};
        emit(chunk(index, {{"tool_calls", json::array({tc})}}, nullptr));
        break;
      }
    }
  }
  if (ev.done) emit(chunk(index, chat_ ? json::object() : json(""), finish_reason(c)));
  else if (!lp.is_null()) emit(chunk(index, chat_ ? json::object() : json(""), nullptr));  // logprobs of held-back text
  return out;
}

std::vector<std::string> OpenAIWriter::end() {
  std::vector<std::string> out;
  if (stream_usage_)
    out.push_back(sse_data({{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                            {"created", created_}, {"model", model_}, {"system_fingerprint", "lily"},
                            {"choices", json::array()}, {"usage", usage_json()}}));
  out.push_back(kSseDone);
  return out;
}

json OpenAIWriter::whole() {
  json arr = json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    json choice = {{"index", int(i)}};
    if (chat_) {
      const std::string content = c.parse.all.content(), reasoning = c.parse.all.reasoning();
      const auto calls = c.parse.all.calls();
      json msg = {{"role", "assistant"}, {"content", content.empty() && !calls.empty() ? json() : json(content)}};
      if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
      if (!calls.empty()) {
        json tcs = json::array();
        for (const auto& t : calls)
          tcs.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        msg["tool_calls"] = tcs;
      }
      choice["message"] = msg;
      choice["logprobs"] = logprobs_ ? json{{"content", c.logprobs}} : json();
    } else {
      choice["text"] = c.parse.all.content();
      choice["logprobs"] = logprobs_ ? c.logprobs : json();
    }
    choice["finish_reason"] = finish_reason(c);
    arr.push_back(choice);
  }
  return {{"id", id_}, {"object", chat_ ? "chat.completion" : "text_completion"}, {"created", created_},
          {"model", model_}, {"system_fingerprint", "lily"}, {"choices", arr}, {"usage", usage_json()}};
}

}  // namespace lily
