// `lily serve`: the OpenAI-compatible HTTP server over one checkpoint (or the demo one).
#include <csignal>

#include <spdlog/spdlog.h>

#include "cli/command.h"
#include "cli/runtime.h"
#include "server/http_server.h"

namespace lily::cli {
namespace {

struct ServeArgs {
  RuntimeArgs rt;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  size_t max_body_mb = 8;
};

HttpServer* g_server = nullptr;
extern "C" void on_signal(int) {
  if (g_server) g_server->stop();
}

int run_serve(ServeArgs& a) {
  auto rt = load_runtime(a.rt);
  if (!rt) return 1;
  HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = a.api_key;
  ho.max_body_bytes = a.max_body_mb << 20;
  if (rt->synthetic)
    ho.model_card = {{"lily_synthetic", true},
                     {"description", "synthetic checkpoint with RANDOM weights: the API and tokenizer are real, "
                                     "the answers are noise"}};
  HttpServer server(*rt->service, ho);
  if (Status st = server.bind(); !st) {
    fmt::print(stderr, "error: {}\n", st.message());
    return 1;
  }
  const auto& names = rt->service->options().model_names;
  spdlog::info("lily serving {} as '{}'{} on http://{}:{} (backend {}, max-seq {}{}{})", rt->dir, names[0],
               names.size() > 1 ? fmt::format(" (also '{}')", names[1]) : "", a.host, server.port(),
               rt->model->backend_name(), rt->engine->options().max_seq, a.api_key.empty() ? "" : ", api key required",
               a.rt.test_hooks ? ", TEST HOOKS ON" : "");
  if (rt->synthetic) spdlog::warn("this checkpoint's weights are RANDOM: replies are noise");
  // Tests read this line to learn the port.
  fmt::print("lily: listening on {}:{}\n", a.host, server.port());
  std::fflush(stdout);
  g_server = &server;
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  server.serve();
  g_server = nullptr;
  spdlog::info("lily: stopped");
  return 0;
}

Registrar reg("serve", "OpenAI-compatible HTTP server", [](CLI::App& app) -> RunFn {
  auto a = std::make_shared<ServeArgs>();
  add_runtime_options(app, a->rt);
  app.add_option("--host", a->host, "address to listen on");
  app.add_option("--port", a->port, "port (0 = any free port, printed on stdout)");
  app.add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  app.add_option("--max-body-mb", a->max_body_mb, "largest request body, MiB (larger: 413)");
  app.add_flag("--test-hooks", a->rt.test_hooks, "accept test-only request fields (lily_forced_output, ...)");
  return [a] { return run_serve(*a); };
});

}  // namespace
}  // namespace lily::cli
