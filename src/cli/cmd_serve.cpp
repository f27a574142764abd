// `lily serve`: the OpenAI- and Anthropic-compatible HTTP server over one checkpoint (or the demo
// one). SIGTERM or SIGINT drains: new requests get 503 while the running ones finish, for at
// most --drain-seconds; then the server stops and whatever is left is cancelled. A second signal
// stops at once.
#include <csignal>
#include <thread>

#include <pthread.h>
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
  int http_threads = 0;
  double drain_seconds = 30;
};

// Blocks the shutdown signals in this thread and every thread it starts later; the main thread
// waits for them with sigwait (no work in a signal handler).
sigset_t shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int run_serve(ServeArgs& a) {
  const sigset_t sigs = shutdown_signals();
  std::signal(SIGPIPE, SIG_IGN);
  auto rt = load_runtime(a.rt);
  if (!rt) return 1;
  HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = a.api_key;
  ho.max_body_bytes = a.max_body_mb << 20;
  ho.n_threads = a.http_threads;
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
  spdlog::info("lily serving {} as '{}'{} on http://{}:{} (backend {}, max-seq {}, parallel {}, {} HTTP threads{}{})", rt->dir,
               names[0], names.size() > 1 ? fmt::format(" (also '{}')", names[1]) : "", a.host, server.port(),
               rt->model->backend_name(), rt->engine->options().max_seq, rt->engine->options().max_batch, server.threads(),
               a.api_key.empty() ? "" : ", api key required", a.rt.test_hooks ? ", TEST HOOKS ON" : "");
  if (rt->synthetic) spdlog::warn("this checkpoint's weights are RANDOM: replies are noise");
  // Tests read this line to learn the port.
  fmt::print("lily: listening on {}:{}\n", a.host, server.port());
  std::fflush(stdout);
  std::thread http([&] { server.serve(); });
  int sig = 0;
  sigwait(&sigs, &sig);
  spdlog::info("lily: signal {}: draining for at most {:.0f} s (a second signal stops now)", sig, a.drain_seconds);
  std::atomic<int> drained{-1};  // -1 draining, 0 out of time, 1 done
  std::thread drainer([&] { drained = server.drain(a.drain_seconds) ? 1 : 0; });
  const timespec tick{0, 50 * 1000 * 1000};
  while (drained < 0) {
    siginfo_t info;
    if (sigtimedwait(&sigs, &info, &tick) > 0) {
      spdlog::warn("lily: second signal: cancelling the running requests");
      server.cancel_drain();
    }
  }
  drainer.join();
  spdlog::info(drained == 1 ? "lily: drained" : "lily: out of time: the requests still running were cancelled");
  server.stop();
  http.join();
  spdlog::info("lily: stopped");
  return 0;
}

Registrar reg("serve", "OpenAI- and Anthropic-compatible HTTP server", [](CLI::App& app) -> RunFn {
  auto a = std::make_shared<ServeArgs>();
  add_runtime_options(app, a->rt);
  app.add_option("--host", a->host, "address to listen on");
  app.add_option("--port", a->port, "port (0 = any free port, printed on stdout)");
  app.add_option("--api-key", a->api_key, "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on /v1/* and /tokenize");
  app.add_option("--max-body-mb", a->max_body_mb, "largest request body, MiB (larger: 413)");
  app.add_option("--http-threads", a->http_threads,
                 "HTTP worker threads (0: --parallel + --max-queue + 32; each open connection holds one)");
  app.add_option("--drain-seconds", a->drain_seconds, "on SIGTERM/SIGINT, how long running requests may finish");
  app.add_flag("--test-hooks", a->rt.test_hooks, "accept test-only request fields (lily_forced_output, ...)");
  return [a] { return run_serve(*a); };
});

}  // namespace
}  // namespace lily::cli
