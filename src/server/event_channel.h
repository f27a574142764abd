// Hands engine events from the engine thread to the HTTP thread serving the request. The
// engine never blocks on a slow client: events queue here until the client side drains them.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "engine/engine.h"

namespace lily {

class EventChannel {
 public:
  void push(GenEvent&& ev) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      q_.push_back(std::move(ev));
    }
    cv_.notify_one();
  }
  // Waits up to `timeout` for an event.
  std::optional<GenEvent> pop(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !q_.empty(); })) return std::nullopt;
    GenEvent ev = std::move(q_.front());
    q_.pop_front();
    return ev;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<GenEvent> q_;
};

}  // namespace lily
