// HttpServer: see http_server.h. Generation routes parse their API's body into an ApiRequest,
// prepare it (CompletionService) and hand it to answer_generation with their API's writer.
#include "server/http_server.h"

#include <chrono>
#include <thread>

#include <sys/socket.h>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "server/generation.h"
#include "server/messages_api.h"
#include "server/openai_writer.h"
#include "server/tokenize_routes.h"

namespace lily {

using nlohmann::json;

namespace {

bool anthropic_route(const std::string& path) { return path.rfind("/v1/messages", 0) == 0; }

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.to_json().dump(), "application/json");
}
void send_anthropic_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(anthropic_error(e).dump(), "application/json");
}
void send_error_for(const std::string& path, httplib::Response& res, const ApiError& e) {
  if (anthropic_route(path)) send_anthropic_error(res, e);
  else send_error(res, e);
}

void send_json(httplib::Response& res, const json& j) {
  res.status = 200;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

std::string route_label(const std::string& path) {
  for (const char* r : {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
                        "/v1/messages/count_tokens", "/v1/models", "/health", "/metrics", "/tokenize", "/detokenize"})
    if (path == r) return r;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  if (path.rfind("/v1/responses/", 0) == 0) return "/v1/responses/{id}";
  return "other";
}

}  // namespace

HttpServer::HttpServer(CompletionService& service, HttpOptions opts)
    : svc_(service), opts_(std::move(opts)), responses_(opts_.stored_responses), http_(std::make_unique<httplib::Server>()) {
  const auto& eo = svc_.engine().options();
  n_threads_ = opts_.n_threads > 0 ? size_t(opts_.n_threads) : size_t(eo.max_batch + eo.max_queue + kHttpHeadroom);
  const size_t n = n_threads_;
  http_->new_task_queue = [n] { return new httplib::ThreadPool(n); };
  http_->set_payload_max_length(opts_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_keep_alive_timeout(5);  // an idle connection holds a worker this long at most
  // httplib listens with a backlog of 5: a burst of connections beyond it waits for the client's
  // SYN retry (a second). The listening socket is noted here and its backlog raised after bind.
  http_->set_socket_options([this](int sock) {
    httplib::default_socket_options(sock);
    listen_fd_ = sock;
  });
  routes();
}

HttpServer::~HttpServer() = default;

Status HttpServer::bind() {
  if (opts_.port == 0) {
    port_ = http_->bind_to_any_port(opts_.host);
    if (port_ <= 0) return errorf("cannot bind {}:(any port)", opts_.host);
  } else {
    if (!http_->bind_to_port(opts_.host, opts_.port)) return errorf("cannot bind {}:{}", opts_.host, opts_.port);
    port_ = opts_.port;
  }
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  return Status::ok();
}

void HttpServer::serve() { http_->listen_after_bind(); }
void HttpServer::stop() { http_->stop(); }

bool HttpServer::drain(double seconds) {
  draining_ = true;
  using clk = std::chrono::steady_clock;
  auto idle = [this] {
    const Engine& e = svc_.engine();
    return in_flight_ == 0 && e.running() == 0 && e.queue_depth() == 0;
  };
  const auto until = clk::now() + std::chrono::duration<double>(seconds);
  while (!idle() && clk::now() < until && !drain_cancelled_) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (idle()) return true;
  active_.cancel_all();  // out of time: each handler answers its cancelled request
  const auto grace = clk::now() + std::chrono::seconds(10);
  while (in_flight_ > 0 && clk::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return false;
}

bool HttpServer::refuse_if_draining(const httplib::Request& req, httplib::Response& res) {
  if (!draining_) return false;
  res.set_header("Retry-After", "5");
  send_error_for(req.path, res, ApiError{503, "The server is shutting down", "server_error", "", "shutting_down"});
  return true;
}

void HttpServer::routes() {
  auto& h = *http_;
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const bool protected_route = req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
    if (opts_.api_key.empty() || !protected_route) return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization"), key = req.get_header_value("x-api-key");
    if (auth == "Bearer " + opts_.api_key || key == opts_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    send_error_for(req.path, res, ApiError{401, auth.empty() && key.empty()
                                                    ? "Missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
                                                    : "Incorrect API key provided",
                                           "invalid_request_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib produces itself (unknown route, body too large, bad request line) get the
  // API's error object too.
  h.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404)
      send_error_for(req.path, res, ApiError{404, fmt::format("Unknown route: {} {}", req.method, req.path),
                                             "invalid_request_error", "", "unknown_url"});
    else if (res.status == 413)
      send_error_for(req.path, res, ApiError{413, fmt::format("The request body is too large (limit {} bytes)", opts_.max_body_bytes),
                                             "invalid_request_error", "", "request_too_large"});
    else
      send_error_for(req.path, res, ApiError{res.status, fmt::format("HTTP error {}", res.status), "invalid_request_error", "", ""});
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      spdlog::error("handler exception: {}", e.what());
    } catch (...) {
      spdlog::error("handler exception");
    }
    send_error_for(req.path, res, ApiError::internal());
  });
  h.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.count_request(route_label(req.path), res.status);
  });

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"status", draining_ ? "draining" : "ok"}, {"queue_depth", svc_.engine().queue_depth()},
                    {"busy", svc_.engine().busy()}, {"running", svc_.engine().running()}});
    if (draining_) res.status = 503;
  });
  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_.render(svc_.engine()), "text/plain; version=0.0.4");
  });
  auto model_obj = [this](const std::string& id) {
    json m = {{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "lily"},
              {"max_model_len", svc_.engine().options().max_seq}};
    for (auto& [k, v] : opts_.model_card.items()) m[k] = v;
    return m;
  };
  h.Get("/v1/models", [this, model_obj](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const auto& n : svc_.options().model_names) data.push_back(model_obj(n));
    send_json(res, {{"object", "list"}, {"data", data}});
  });
  h.Get(R"(/v1/models/(.+))", [this, model_obj](const httplib::Request& req, httplib::Response& res) {
    std::string id = req.matches[1];
    for (const auto& n : svc_.options().model_names)
      if (n == id) return send_json(res, model_obj(n));
    send_error(res, ApiError{404, fmt::format("The model '{}' does not exist", id), "invalid_request_error", "model",
                             "model_not_found"});
  });
  add_tokenize_routes(h, svc_);
  api_routes();
  generation_routes();
}

void HttpServer::api_routes() {
  auto& h = *http_;
  h.Get(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (auto r = responses_.get(req.matches[1])) return send_json(res, r->response);
    send_error(res, ApiError{404, fmt::format("Response with id '{}' not found.", std::string(req.matches[1])),
                             "invalid_request_error", "", "not_found"});
  });
  h.Delete(R"(/v1/responses/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (responses_.erase(id)) return send_json(res, {{"id", id}, {"object", "response"}, {"deleted", true}});
    send_error(res, ApiError{404, fmt::format("Response with id '{}' not found.", id), "invalid_request_error", "", "not_found"});
  });
  h.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    nlohmann::ordered_json body;
    ApiRequest api;
    PreparedRequest prep;
    if (auto e = parse_request_body(req.body, body)) return send_anthropic_error(res, *e);
    if (auto e = parse_messages_request(body, svc_.options().test_hooks, true, api)) return send_anthropic_error(res, *e);
    api.max_tokens = 1;
    if (auto e = svc_.prepare(api, prep)) return send_anthropic_error(res, *e);
    send_json(res, {{"input_tokens", int(prep.gen->prompt.size())}});
  });
}

void HttpServer::generation_routes() {
  auto& h = *http_;
  const bool hooks = svc_.options().test_hooks;
  auto hooks_for = [this](const std::string& path) {
    GenerationHooks g;
    g.metrics = &metrics_;
    g.in_flight = &in_flight_;
    g.active = &active_;
    g.send_error = [path](httplib::Response& res, const ApiError& e) { send_error_for(path, res, e); };
    return g;
  };
  // ordered: the template prints tool schemas in the client's key order, as HF does.
  auto openai = [this, hooks, hooks_for](bool chat, const httplib::Request& req, httplib::Response& res) {
    if (refuse_if_draining(req, res)) return;
    nlohmann::ordered_json body;
    if (auto e = parse_request_body(req.body, body)) return send_error(res, *e);
    ApiRequest api;
    if (auto e = chat ? parse_chat_request(body, hooks, api) : parse_completion_request(body, hooks, api))
      return send_error(res, *e);
    PreparedRequest prep;
    if (auto e = svc_.prepare(api, prep)) return send_error(res, *e);
    auto w = std::make_shared<OpenAIWriter>(api, prep.parser, prep.model, svc_.tokenizer());
    answer_generation(svc_.engine(), req, res, std::move(prep), w, api.stream, hooks_for(req.path));
  };
  h.Post("/v1/chat/completions", [openai](const httplib::Request& req, httplib::Response& res) { openai(true, req, res); });
  h.Post("/v1/completions", [openai](const httplib::Request& req, httplib::Response& res) { openai(false, req, res); });

  h.Post("/v1/responses", [this, hooks, hooks_for](const httplib::Request& req, httplib::Response& res) {
    if (refuse_if_draining(req, res)) return;
    nlohmann::ordered_json body;
    if (auto e = parse_request_body(req.body, body)) return send_error(res, *e);
    ApiRequest api;
    ResponsesContext ctx;
    if (auto e = parse_responses_request(body, hooks, responses_, api, ctx)) return send_error(res, *e);
    PreparedRequest prep;
    if (auto e = svc_.prepare(api, prep)) return send_error(res, *e);
    auto w = std::make_shared<ResponsesWriter>(api, prep.parser, prep.model, std::move(ctx));
    GenerationHooks g = hooks_for(req.path);
    if (w->context().store) g.on_complete = [this, w] { responses_.put(w->id(), w->stored()); };
    answer_generation(svc_.engine(), req, res, std::move(prep), w, api.stream, std::move(g));
  });

  h.Post("/v1/messages", [this, hooks, hooks_for](const httplib::Request& req, httplib::Response& res) {
    if (refuse_if_draining(req, res)) return;
    nlohmann::ordered_json body;
    if (auto e = parse_request_body(req.body, body)) return send_anthropic_error(res, *e);
    ApiRequest api;
    if (auto e = parse_messages_request(body, hooks, false, api)) return send_anthropic_error(res, *e);
    PreparedRequest prep;
    if (auto e = svc_.prepare(api, prep)) return send_anthropic_error(res, *e);
    auto w = std::make_shared<MessagesWriter>(prep.parser, prep.model);
    answer_generation(svc_.engine(), req, res, std::move(prep), w, api.stream, hooks_for(req.path));
  });
}

}  // namespace lily
