// HttpServer: see http_server.h. Each generation request waits on its own HTTP thread for
// engine events; a streaming client that goes away makes a write fail, which sets the
// request's cancel flag, so the engine drops it before its next step.
#include "server/http_server.h"

#include <chrono>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "server/event_channel.h"
#include "server/response_builder.h"

namespace lily {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(e.to_json().dump(), "application/json");
}

void send_json(httplib::Response& res, const json& j) {
  res.status = 200;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

std::string route_label(const std::string& path) {
  for (const char* r : {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics"})
    if (path == r) return r;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

// Latency bookkeeping for one request: time to first token, then gaps between tokens.
struct TokenClock {
  Clock::time_point start = Clock::now(), last;
  bool first = true;
  void tick(Metrics& m, size_t n_tokens) {
    if (n_tokens == 0) return;
    auto now = Clock::now();
    if (first) m.observe_ttft(std::chrono::duration<double>(now - start).count());
    else m.observe_itl(std::chrono::duration<double>(now - last).count() / double(n_tokens));
    first = false;
    last = now;
  }
};

void log_request(const ResponseBuilder& b, const TokenClock& c) {
  const auto& u = b.usage();
  double secs = std::chrono::duration<double>(Clock::now() - c.start).count();
  spdlog::info("{} prompt={} cached={} completion={} finish={} {:.2f}s {:.1f} tok/s", b.id(), u.prompt_tokens,
               u.cached_tokens, u.completion_tokens, finish_reason_name(b.finish()), secs,
               secs > 0 ? u.completion_tokens / secs : 0.0);
}

}  // namespace

HttpServer::HttpServer(CompletionService& service, HttpOptions opts)
    : svc_(service), opts_(std::move(opts)), http_(std::make_unique<httplib::Server>()) {
  // One thread per waiting or streaming request plus headroom, so /health and /metrics answer
  // even when the queue is full.
  size_t n = opts_.n_threads > 0 ? size_t(opts_.n_threads) : size_t(svc_.engine().options().max_queue + 8);
  http_->new_task_queue = [n] { return new httplib::ThreadPool(n); };
  http_->set_payload_max_length(opts_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
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
  return Status::ok();
}

void HttpServer::serve() { http_->listen_after_bind(); }
void HttpServer::stop() { http_->stop(); }

void HttpServer::routes() {
  auto& h = *http_;
  h.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (opts_.api_key.empty() || req.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + opts_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError{401, auth.empty() ? "Missing API key: send 'Authorization: Bearer <key>'"
                                               : "Incorrect API key provided",
                             "invalid_request_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib produces itself (unknown route, body too large, bad request line) get
  // OpenAI's error object too.
  h.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 404)
      send_error(res, ApiError{404, fmt::format("Unknown route: {} {}", req.method, req.path), "invalid_request_error",
                               "", "unknown_url"});
    else if (res.status == 413)
      send_error(res, ApiError{413, fmt::format("The request body is too large (limit {} bytes)", opts_.max_body_bytes),
                               "invalid_request_error", "", "request_too_large"});
    else
      send_error(res, ApiError{res.status, fmt::format("HTTP error {}", res.status), "invalid_request_error", "", ""});
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      spdlog::error("handler exception: {}", e.what());
    } catch (...) {
      spdlog::error("handler exception");
    }
    send_error(res, ApiError::internal());
  });
  h.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics_.count_request(route_label(req.path), res.status);
  });

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"status", "ok"}, {"queue_depth", svc_.engine().queue_depth()}, {"busy", svc_.engine().busy()},
                         {"running", svc_.engine().running()}});
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

  auto generate = [this](bool chat, const httplib::Request& req, httplib::Response& res) {
    // ordered: the template prints tool schemas in the client's key order, as HF does.
    nlohmann::ordered_json body;
    if (auto e = parse_request_body(req.body, body)) return send_error(res, *e);
    ApiRequest api;
    const bool hooks = svc_.options().test_hooks;
    if (auto e = chat ? parse_chat_request(body, hooks, api) : parse_completion_request(body, hooks, api))
      return send_error(res, *e);
    PreparedRequest prep;
    if (auto e = svc_.prepare(api, prep)) return send_error(res, *e);

    auto channel = std::make_shared<EventChannel>();
    prep.gen->on_event = [channel](GenEvent&& ev) { channel->push(std::move(ev)); };
    auto builder = std::make_shared<ResponseBuilder>(api, prep.parser, prep.model, svc_.tokenizer());
    auto clock = std::make_shared<TokenClock>();
    auto gen = prep.gen;
    if (!svc_.engine().submit(gen)) {
      res.set_header("Retry-After", "1");
      return send_error(res, ApiError{503, "The server is busy: its request queue is full; retry shortly", "server_error",
                                      "", "queue_full"});
    }

    if (!api.stream) {
      for (;;) {
        auto ev = channel->pop(std::chrono::milliseconds(1000));
        if (!ev) continue;
        clock->tick(metrics_, ev->tokens.size());
        builder->on_event(*ev);
        if (!ev->done) continue;
        if (ev->finish == FinishReason::kError) {
          spdlog::error("{}: engine error: {}", builder->id(), ev->error);
          return send_error(res, ApiError::internal());
        }
        if (ev->finish == FinishReason::kCancelled)
          return send_error(res, ApiError{503, "The server is shutting down", "server_error", "", ""});
        log_request(*builder, *clock);
        return send_json(res, builder->whole());
      }
    }

    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    auto finished = std::make_shared<std::atomic<bool>>(false);
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, channel, builder, clock, gen, finished](size_t, httplib::DataSink& sink) {
          auto write = [&](const std::string& s) {
            if (sink.write(s.data(), s.size())) return true;
            gen->cancelled = true;  // the client went away: free the engine
            return false;
          };
          for (;;) {
            auto ev = channel->pop(std::chrono::milliseconds(1000));
            if (!ev) {
              // Still queued or prefilling: an SSE comment tells a gone client apart.
              if (!write(": keep-alive\n\n")) return false;
              continue;
            }
            clock->tick(metrics_, ev->tokens.size());
            for (const auto& c : builder->on_event(*ev))
              if (!write(sse_data(c))) return false;
            if (!ev->done) continue;
            if (ev->finish == FinishReason::kError) {
              spdlog::error("{}: engine error: {}", builder->id(), ev->error);
              write(sse_data(ApiError::internal().to_json()));
            } else {
              log_request(*builder, *clock);
            }
            *finished = true;
            if (!write(kSseDone)) return false;
            sink.done();
            return true;
          }
        },
        [gen, finished](bool) {
          if (!*finished) gen->cancelled = true;
        });
  };
  h.Post("/v1/chat/completions", [generate](const httplib::Request& req, httplib::Response& res) { generate(true, req, res); });
  h.Post("/v1/completions", [generate](const httplib::Request& req, httplib::Response& res) { generate(false, req, res); });
}

}  // namespace lily
