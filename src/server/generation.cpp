// answer_generation: see generation.h.
#include "server/generation.h"

#include <chrono>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "server/client_watch.h"
#include "server/event_channel.h"

namespace lily {

namespace {

using Clock = std::chrono::steady_clock;

// Latency bookkeeping for one request: time to first token, then gaps between tokens.
struct TokenClock {
  Clock::time_point start = Clock::now(), last;
  bool first = true;
  void tick(Metrics* m, size_t n_tokens) {
    if (n_tokens == 0 || !m) return;
    auto now = Clock::now();
    if (first) m->observe_ttft(std::chrono::duration<double>(now - start).count());
    else m->observe_itl(std::chrono::duration<double>(now - last).count() / double(n_tokens));
    first = false;
    last = now;
  }
};

void log_request(const ReplyWriter& w, const TokenClock& c) {
  const auto u = w.usage();
  double secs = std::chrono::duration<double>(Clock::now() - c.start).count();
  spdlog::info("{} prompt={} cached={} completion={} finish={} {:.2f}s {:.1f} tok/s", w.id(), u.prompt_tokens,
               u.cached_tokens, u.completion_tokens, finish_reason_name(w.finish()), secs,
               secs > 0 ? u.completion_tokens / secs : 0.0);
}

// Decrements the in-flight count when the last owner of the request's answer lets go.
struct InFlight {
  std::atomic<int>* n;
  explicit InFlight(std::atomic<int>* c) : n(c) {
    if (n) ++*n;
  }
  ~InFlight() {
    if (n) --*n;
  }
};

}  // namespace

void ActiveRequests::add(const std::vector<std::shared_ptr<GenRequest>>& reqs) {
  std::lock_guard<std::mutex> lk(mu_);
  std::erase_if(reqs_, [](const std::weak_ptr<GenRequest>& w) { return w.expired(); });
  for (const auto& r : reqs) reqs_.push_back(r);
}

void ActiveRequests::cancel_all() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& w : reqs_)
    if (auto r = w.lock()) r->cancelled = true;
}

void answer_generation(Engine& engine, const httplib::Request& req, httplib::Response& res, PreparedRequest prep,
                       std::shared_ptr<ReplyWriter> writer, bool stream, GenerationHooks hooks) {
  auto flight = std::make_shared<InFlight>(hooks.in_flight);
  std::vector<std::shared_ptr<GenRequest>> all{prep.gen};
  for (auto& f : prep.gen->forks) all.push_back(f);
  auto channel = std::make_shared<EventChannel>();
  for (size_t i = 0; i < all.size(); ++i)
    all[i]->on_event = [channel, i](GenEvent&& ev) { channel->push(int(i), std::move(ev)); };
  auto cancel = [all] {
    for (auto& g : all) g->cancelled = true;
  };
  auto clock = std::make_shared<TokenClock>();
  if (hooks.active) hooks.active->add(all);
  if (!engine.submit(prep.gen)) {
    res.set_header("Retry-After", "1");
    return hooks.send_error(res, ApiError{503, "The server is busy: its request queue is full; retry shortly",
                                          "server_error", "", "queue_full"});
  }
  const int n = int(all.size());

  if (!stream) {
    ClientWatch watch(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
    auto checked = Clock::now();
    bool failed = false, cancelled = false, gone = false, oom = false;
    for (int done = 0; done < n;) {
      auto ce = channel->pop(std::chrono::milliseconds(250));
      if (!gone && Clock::now() - checked > std::chrono::milliseconds(250)) {
        checked = Clock::now();
        if (watch.gone()) {  // the client left: free its slot now
          gone = true;
          cancel();
        }
      }
      if (!ce) continue;
      clock->tick(hooks.metrics, ce->ev.tokens.size());
      writer->on_event(ce->choice, ce->ev);
      if (!ce->ev.done) continue;
      ++done;
      if (ce->ev.finish == FinishReason::kError) {
        spdlog::error("{}: engine error: {}", writer->id(), ce->ev.error);
        failed = true;
        oom = oom || ce->ev.out_of_memory;
      }
      cancelled = cancelled || ce->ev.finish == FinishReason::kCancelled;
    }
    if (gone) {
      spdlog::info("{}: client disconnected; cancelled", writer->id());
      return hooks.send_error(res, ApiError{499, "The client closed the connection", "invalid_request_error", "", ""});
    }
    if (failed && oom) {
      res.set_header("Retry-After", "1");
      return hooks.send_error(res, ApiError::out_of_memory());
    }
    if (failed) return hooks.send_error(res, ApiError::internal());
    if (cancelled) return hooks.send_error(res, ApiError{503, "The server is shutting down", "server_error", "", ""});
    log_request(*writer, *clock);
    if (hooks.on_complete) hooks.on_complete();
    res.status = 200;
    res.set_content(writer->whole().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  auto finished = std::make_shared<std::atomic<bool>>(false);
  auto done = std::make_shared<int>(0);
  auto failed = std::make_shared<bool>(false), cancelled = std::make_shared<bool>(false),
       oom = std::make_shared<bool>(false);
  Metrics* metrics = hooks.metrics;
  auto on_complete = hooks.on_complete;
  res.set_chunked_content_provider(
      "text/event-stream",
      [channel, writer, clock, cancel, finished, done, failed, cancelled, oom, n, metrics, on_complete, flight](size_t offset, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          cancel();  // the client went away: free the engine
          return false;
        };
        if (offset == 0)
          for (const auto& f : writer->begin())
            if (!write(f)) return false;
        for (;;) {
          auto ce = channel->pop(std::chrono::milliseconds(1000));
          if (!ce) {
            // Still queued or prefilling: an SSE comment tells a gone client apart.
            if (!write(": keep-alive\n\n")) return false;
            continue;
          }
          clock->tick(metrics, ce->ev.tokens.size());
          for (const auto& f : writer->on_event(ce->choice, ce->ev))
            if (!write(f)) return false;
          if (!ce->ev.done) continue;
          if (ce->ev.finish == FinishReason::kError) {
            spdlog::error("{}: engine error: {}", writer->id(), ce->ev.error);
            *failed = true;
            *oom = *oom || ce->ev.out_of_memory;
          }
          *cancelled = *cancelled || ce->ev.finish == FinishReason::kCancelled;
          if (++*done < n) continue;
          if (*failed) {
            write(writer->error_frame(*oom ? ApiError::out_of_memory() : ApiError::internal()));
          } else if (*cancelled) {  // (a client that left reads nothing; this is the shutdown)
            write(writer->error_frame(ApiError{503, "The server is shutting down", "server_error", "", "shutting_down"}));
          } else {
            log_request(*writer, *clock);
            if (on_complete) on_complete();
          }
          *finished = true;
          for (const auto& f : writer->end())
            if (!write(f)) return false;
          sink.done();
          return true;
        }
      },
      [cancel, finished](bool) {
        if (!*finished) cancel();
      });
}

}  // namespace lily
