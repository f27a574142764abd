// The HTTP front: the OpenAI routes (chat completions, completions, responses), Anthropic's
// messages, llama.cpp's tokenize/detokenize, models, health and metrics over cpp-httplib; auth,
// error mapping (each API's own error shape), SSE and the drain on shutdown. It knows the engine
// (through CompletionService) and nothing below it.
#pragma once
#include <atomic>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "server/completion_service.h"
#include "server/generation.h"
#include "server/metrics.h"
#include "server/responses_api.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace lily {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;                 // "" = no auth
  size_t max_body_bytes = 8u << 20;    // larger bodies get 413
  // Worker threads. A thread serves one connection at a time, idle keep-alive ones included: 0 =
  // one per running request (--parallel) and per waiting one (--max-queue), plus kHttpHeadroom
  // for /health, /metrics, refusals (503) and idle connections.
  int n_threads = 0;
  nlohmann::json model_card;           // extra fields for /v1/models entries
  size_t stored_responses = 1000;      // /v1/responses kept for previous_response_id and GET
};
inline constexpr int kHttpHeadroom = 32;

class HttpServer {
 public:
  HttpServer(CompletionService& service, HttpOptions opts);
  ~HttpServer();
  // Binds (port 0 picks a free one) and serves until stop(). Returns the bind error, if any.
  Status bind();
  int port() const { return port_; }
  size_t threads() const { return n_threads_; }
  void serve();  // blocks
  void stop();
  // Refuses new generation requests (503) and waits until the running ones are answered or
  // `seconds` pass (or cancel_drain()); then cancels what is left and waits for those answers.
  // Returns whether everything finished in time. The caller stops the server after.
  bool drain(double seconds);
  void cancel_drain() { drain_cancelled_ = true; }

 private:
  void routes();
  void api_routes();
  void generation_routes();
  bool refuse_if_draining(const httplib::Request& req, httplib::Response& res);
  CompletionService& svc_;
  HttpOptions opts_;
  Metrics metrics_;
  ResponseStore responses_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  int listen_fd_ = -1;
  size_t n_threads_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<int> in_flight_{0};  // generation requests being answered
  std::atomic<bool> drain_cancelled_{false};
  ActiveRequests active_;
};

}  // namespace lily
