// `lily chat`: an interactive terminal chat over the engine (no HTTP): streams the reply,
// shows the reasoning dimmed, keeps the history (so follow-up turns reuse the cached state),
// and Ctrl-C stops the reply, not the program.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/runtime.h"
#include "server/event_channel.h"
#include "server/reply_parser.h"

namespace lily::cli {
namespace {

struct ChatArgs {
  RuntimeArgs rt;
  std::string system;
  bool no_think = false;
  int max_tokens = 0;      // 0 = up to the context length
  float temperature = -1;  // < 0: the checkpoint's default
};

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

struct Style {
  bool tty = isatty(STDOUT_FILENO);
  const char* dim() const { return tty ? "\x1b[2m" : ""; }
  const char* bold() const { return tty ? "\x1b[1m" : ""; }
  const char* reset() const { return tty ? "\x1b[0m" : ""; }
};

// Streams one reply; returns the assistant message to keep in the history.
nlohmann::ordered_json reply(Runtime& rt, const ChatArgs& a, const nlohmann::ordered_json& messages, const Style& st) {
  ApiRequest req;
  req.chat = true;
  req.messages = messages;
  if (a.max_tokens > 0) req.max_tokens = a.max_tokens;
  if (a.temperature >= 0) req.temperature = a.temperature;
  if (a.no_think) req.enable_thinking = false;
  PreparedRequest prep;
  if (auto e = rt.service->prepare(req, prep)) {
    fmt::print("{}error: {}{}\n", st.dim(), e->message, st.reset());
    return nullptr;
  }
  auto channel = std::make_shared<EventChannel>();
  prep.gen->on_event = [channel](GenEvent&& ev) { channel->push(0, std::move(ev)); };
  auto t0 = std::chrono::steady_clock::now();
  g_interrupted = false;
  if (!rt.engine->submit(prep.gen)) {
    fmt::print("error: engine busy\n");
    return nullptr;
  }
  ReplyParser parser(prep.parser);
  std::string content, reasoning;
  bool in_dim = false;
  auto show = [&](const ReplyDelta& d) {
    for (const auto& it : d.items) {
      if (it.kind == ReplyItem::Kind::kReasoning) {
        if (!in_dim) fmt::print("{}", st.dim());
        in_dim = true;
        fmt::print("{}", it.text);
        reasoning += it.text;
      } else if (it.kind == ReplyItem::Kind::kContent) {
        if (in_dim) fmt::print("{}\n\n", st.reset());
        in_dim = false;
        fmt::print("{}", it.text);
        content += it.text;
      }
    }
    std::fflush(stdout);
  };
  GenUsage usage;
  FinishReason finish = FinishReason::kStop;
  for (;;) {
    if (g_interrupted) prep.gen->cancelled = true;
    auto ev = channel->pop(std::chrono::milliseconds(50));
    if (!ev) continue;
    show(parser.push(ev->ev.text));
    if (!ev->ev.done) continue;
    show(parser.flush());
    usage = ev->ev.usage;
    finish = ev->ev.finish;
    break;
  }
  if (in_dim) fmt::print("{}", st.reset());
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("\n{}[{} tokens, {:.1f} tok/s, {} of {} prompt tokens cached{}]{}\n", st.dim(), usage.completion_tokens,
             secs > 0 ? usage.completion_tokens / secs : 0.0, usage.cached_tokens, usage.prompt_tokens,
             finish == FinishReason::kCancelled ? ", stopped" : (finish == FinishReason::kLength ? ", length" : ""),
             st.reset());
  nlohmann::ordered_json m = {{"role", "assistant"}, {"content", content}};
  return m;
}

int run_chat(ChatArgs& a) {
  auto rt = load_runtime(a.rt);
  if (!rt) return 1;
  if (!rt->tmpl) {
    fmt::print(stderr, "error: this checkpoint has no chat template\n");
    return 1;
  }
  Style st;
  if (rt->synthetic) fmt::print("{}(this checkpoint's weights are random: replies are noise){}\n", st.dim(), st.reset());
  fmt::print("{}lily chat — /reset clears the history, /exit quits, Ctrl-C stops a reply{}\n", st.dim(), st.reset());
  // Ctrl-C: stop the reply. Without SA_RESTART a pending read returns, so the prompt notices too.
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);

  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  if (!a.system.empty()) history.push_back({{"role", "system"}, {"content", a.system}});
  for (;;) {
    fmt::print("{}> {}", st.bold(), st.reset());
    std::fflush(stdout);
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted && !std::cin.eof()) {
        std::cin.clear();
        fmt::print("\n{}(/exit or Ctrl-D quits){}\n", st.dim(), st.reset());
        continue;
      }
      fmt::print("\n");
      return 0;
    }
    if (line == "/exit" || line == "/quit") return 0;
    if (line == "/reset") {
      history.erase(history.begin() + (a.system.empty() ? 0 : 1), history.end());
      continue;
    }
    if (line.empty()) continue;
    auto msgs = history;
    msgs.push_back({{"role", "user"}, {"content", line}});
    auto m = reply(*rt, a, msgs, st);
    if (m.is_null()) continue;
    history = std::move(msgs);
    history.push_back(std::move(m));
  }
}

Registrar reg("chat", "interactive terminal chat", [](CLI::App& app) -> RunFn {
  auto a = std::make_shared<ChatArgs>();
  a->rt.parallel = 1;  // one conversation, one request at a time (serve's default prepares a GPU for 256)
  add_runtime_options(app, a->rt);
  app.add_option("--system", a->system, "system prompt");
  app.add_flag("--no-think", a->no_think, "disable thinking (enable_thinking=false)");
  app.add_option("--max-tokens", a->max_tokens, "longest reply, tokens (0 = up to the context length)");
  app.add_option("--temperature", a->temperature, "sampling temperature (default: the checkpoint's)");
  return [a] { return run_chat(*a); };
});

}  // namespace
}  // namespace lily::cli
