// Tokenize routes: see tokenize_routes.h.
#include "server/tokenize_routes.h"

#include <httplib.h>

#include "server/completion_service.h"
#include "text/utf8.h"

namespace lily {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

void reply(httplib::Response& res, const ApiError* e, const json& j = json()) {
  res.status = e ? e->status : 200;
  res.set_content(e ? e->to_json().dump() : j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

void add_tokenize_routes(httplib::Server& h, CompletionService& svc) {
  h.Post("/tokenize", [&svc](const httplib::Request& req, httplib::Response& res) {
    ojson b;
    if (auto e = parse_request_body(req.body, b)) return reply(res, &*e);
    if (!b.is_object()) {
      ApiError e = ApiError::bad_request("the request body must be a JSON object");
      return reply(res, &e);
    }
    std::string text;
    if (b.contains("content") && b["content"].is_string()) {
      text = b["content"];
    } else if (b.contains("prompt") && b["prompt"].is_string()) {
      text = b["prompt"];
    } else if (b.contains("messages")) {
      ojson chat = {{"messages", b["messages"]}};
      if (b.contains("chat_template_kwargs")) chat["chat_template_kwargs"] = b["chat_template_kwargs"];
      if (b.contains("tools")) chat["tools"] = b["tools"];
      ApiRequest api;
      if (auto e = parse_chat_request(chat, false, api)) return reply(res, &*e);
      auto p = svc.render(api);
      if (!p) {
        ApiError e = ApiError::bad_request(p.message(), "messages");
        return reply(res, &e);
      }
      text = std::move(p).value();
    } else {
      ApiError e = ApiError::bad_request("'content' (a string) is required", "content");
      return reply(res, &e);
    }
    for (const char* k : {"add_special", "with_pieces"})
      if (b.contains(k) && !b[k].is_boolean()) {
        ApiError e = ApiError::bad_request(std::string("'") + k + "' must be a boolean", k);
        return reply(res, &e);
      }
    const Tokenizer& tok = svc.tokenizer();
    const auto ids = tok.encode(text);
    json tokens = json::array();
    const bool pieces = b.value("with_pieces", false);
    for (int32_t id : ids) {
      if (!pieces) {
        tokens.push_back(id);
        continue;
      }
      const std::string* bytes = tok.token_bytes(id);
      const std::string piece = bytes ? *bytes : std::string();
      json p;  // the piece as text when it is valid UTF-8, else its bytes (as llama.cpp does)
      if (utf8::is_valid(piece)) {
        p = piece;
      } else {
        p = json::array();
        for (unsigned char c : piece) p.push_back(int(c));
      }
      tokens.push_back({{"id", id}, {"piece", p}});
    }
    reply(res, nullptr, {{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", svc.engine().options().max_seq}});
  });
  h.Post("/detokenize", [&svc](const httplib::Request& req, httplib::Response& res) {
    ojson b;
    if (auto e = parse_request_body(req.body, b)) return reply(res, &*e);
    if (!b.is_object() || !b.contains("tokens") || !b["tokens"].is_array()) {
      ApiError e = ApiError::bad_request("'tokens' (an array of token ids) is required", "tokens");
      return reply(res, &e);
    }
    std::vector<int32_t> ids;
    const int vocab = svc.tokenizer().vocab_size();
    for (const auto& t : b["tokens"]) {
      if (!t.is_number_integer() || t.get<long long>() < 0 || t.get<long long>() >= vocab) {
        ApiError e = ApiError::bad_request("'tokens' must hold token ids from 0 to " + std::to_string(vocab - 1), "tokens");
        return reply(res, &e);
      }
      ids.push_back(int32_t(t.get<long long>()));
    }
    const std::string text = svc.tokenizer().decode(ids, false);
    reply(res, nullptr, {{"content", text}, {"prompt", text}});
  });
}

}  // namespace lily
