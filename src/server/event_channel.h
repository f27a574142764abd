// Hands engine events from the engine thread to the HTTP thread serving the request. The
// engine never blocks on a slow client: events queue here until the client side drains them.
// Each event carries the index of its choice (n > 1 requests share one channel).
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "engine/engine.h"

namespace lily {

struct ChoiceEvent {
  int choice = 0;
  GenEvent ev;
};

class EventChannel {
 public:
  void push(int choice, GenEvent&& ev) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back({choice, std::move(ev)});
    }
    cv_.notify_one();
  }
  // Waits up to `timeout` for an event.
  std::optional<ChoiceEvent> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    ChoiceEvent ev = std::move(q_.front());
    q_.pop_front();
    return ev;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ChoiceEvent> q_;
};

}  // namespace lily
