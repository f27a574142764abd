// The HTTP front: OpenAI routes over cpp-httplib, SSE streaming, auth, error mapping and
// metrics. It knows the engine (through CompletionService) and nothing below it.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "server/completion_service.h"
#include "server/metrics.h"

namespace httplib {
class Server;
}

namespace lily {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;                 // "" = no auth
  size_t max_body_bytes = 8u << 20;    // larger bodies get 413
  int n_threads = 0;                   // 0 = engine queue + 8
  nlohmann::json model_card;           // extra fields for /v1/models entries
};

class HttpServer {
 public:
  HttpServer(CompletionService& service, HttpOptions opts);
  ~HttpServer();
  // Binds (port 0 picks a free one) and serves until stop(). Returns the bind error, if any.
  Status bind();
  int port() const { return port_; }
  void serve();  // blocks
  void stop();

 private:
  void routes();
  CompletionService& svc_;
  HttpOptions opts_;
  Metrics metrics_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
};

}  // namespace lily
