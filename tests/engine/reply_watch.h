// What the engine tests keep of a request's events: its tokens, its text and its last event, as they
// come on the engine thread, and a future that is ready when the last one has come.
#pragma once
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace lily {

struct Reply {
  std::vector<GenToken> tokens;
  std::string text;
  GenEvent last;                 // the done event
  std::shared_future<void> done;  // ready after the done event

  std::vector<int32_t> ids() const {
    std::vector<int32_t> v;
    for (const GenToken& t : tokens) v.push_back(t.id);
    return v;
  }
};

// Sets r.on_event to fill the returned reply (submit r after). `at_event`, if given, runs at each
// event once its tokens are kept and before `done` is ready: a test's hook into the engine thread.
inline std::shared_ptr<Reply> watch(GenRequest& r, std::function<void(const Reply&)> at_event = {}) {
  auto out = std::make_shared<Reply>();
  auto done = std::make_shared<std::promise<void>>();
  out->done = done->get_future().share();
  r.on_event = [out, done, at_event = std::move(at_event)](GenEvent&& ev) {
    out->text += ev.text;
    for (const GenToken& t : ev.tokens) out->tokens.push_back(t);
    if (at_event) at_event(*out);
    if (ev.done) {
      out->last = std::move(ev);
      done->set_value();
    }
  };
  return out;
}

// A watch() hook that cancels r once its reply holds n tokens.
inline std::function<void(const Reply&)> cancel_after(GenRequest& r, int n) {
  GenRequest* raw = &r;
  return [raw, n](const Reply& got) {
    if (int(got.tokens.size()) >= n) raw->cancelled = true;
  };
}

}  // namespace lily
