// A backend without a model, for the engine's scheduler tests (scheduler_test.cpp). A state is the
// list of tokens it consumed; the token after it is a fixed function of that whole list (a rolling
// hash), so every request's reply is known in advance and any token fed twice, skipped or fed to the
// wrong state changes everything after it. Every step is logged (which state, at which position,
// how many tokens, whether an output was asked), and advances a fake clock by a cost model: the
// tests read latencies off that clock, never off wall time. With `pipelines` the backend behaves as
// CUDA's launch/wait: a lone one-token drawn feed returns before its draw is known, kDrawnToken feeds
// the previous draw, and at most two steps are in flight.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace lily::fake {

// The token after a history whose rolling hash is h: an ordinary token id in [10, 1010).
inline int32_t next_after(uint64_t h) { return int32_t(10 + (h >> 17) % 1000); }
inline uint64_t roll(uint64_t h, int32_t t) { return (h ^ uint64_t(t + 1)) * 0x100000001b3ull; }
constexpr uint64_t kHashSeed = 0xcbf29ce484222325ull;

// The reply a request of `prompt` gets: n tokens, each the function of the prompt and the reply so far.
inline std::vector<int32_t> expected_reply(std::span<const int32_t> prompt, int n) {
  uint64_t h = kHashSeed;
  for (int32_t t : prompt) h = roll(h, t);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(next_after(h));
    h = roll(h, out.back());
  }
  return out;
}

// What a state of this backend takes: 1,000 bytes plus 10 per position (StateMemory arithmetic).
inline StateMemory fake_memory() {
  StateMemory m;
  m.fixed = 1000, m.per_position = 10, m.initial_positions = 0, m.position_step = 1;
  return m;
}

struct State final : SeqState {
  std::vector<int32_t> toks;
  uint64_t h = kHashSeed;
  int limit = 0, cap = 0;
  int32_t last_draw = -1;  // the token the last step drew for this state (kDrawnToken's value)
  int n_tokens() const override { return int(toks.size()); }
  int max_seq() const override { return limit; }
  size_t bytes() const override { return fake_memory().bytes_at(cap); }
  std::unique_ptr<SeqState> clone() const override {
    auto c = std::make_unique<State>(*this);
    c->cap = std::max(1, n_tokens());
    return c;
  }
  void reset() override { toks.clear(), h = kHashSeed, last_draw = -1; }
  Status reserve(int n, int upto = 0) override {
    if (n > limit) return errorf("the sequence needs {} tokens; its limit (max_seq) is {}", n, limit);
    if (n > cap) cap = upto >= n ? std::min(upto, limit) : std::min(limit, std::max(n, 2 * cap));
    return Status::ok();
  }
};

// One feed of a logged step.
struct LoggedFeed {
  int32_t first = 0;  // the state's first token (tells the requests apart: their prompts differ there)
  int pos = 0;        // position of the feed's first token
  int len = 0;        // tokens fed
  bool out = false;   // logits or a draw asked
};
struct LoggedStep {
  std::vector<LoggedFeed> feeds;
  double t_end_ms = 0;  // the fake clock when the step's outputs are ready
  bool pipelined = false;
};

class Backend final : public lily::Backend {
 public:
  Backend(int vocab, bool pipelines) : vocab_(vocab), pipelines_(pipelines) {}
  const char* name() const override { return "fake"; }
  int vocab_size() const override { return vocab_; }
  bool pipelines() const override { return pipelines_; }
  Result<std::unique_ptr<SeqState>> new_state(int max_seq) override {
    auto s = std::make_unique<State>();
    s->limit = max_seq;
    return std::unique_ptr<SeqState>(std::move(s));
  }
  StateMemory state_memory(int) const override { return fake_memory(); }

  // The cost model of the fake clock: a step of R feeds and T tokens takes 1 + 0.01·T + 0.05·R ms.
  static double cost_ms(int tokens, int feeds) { return 1.0 + 0.01 * tokens + 0.05 * feeds; }
  double now_ms() const {
    std::lock_guard<std::mutex> lk(mu_);
    return now_ms_;
  }
  std::vector<LoggedStep> log() const {
    std::lock_guard<std::mutex> lk(mu_);
    return log_;
  }
  // Called at the start of every launch with the number of steps launched before it (engine thread).
  std::function<void(int)> on_launch;
  int fail_step = -1;  // the step of this index fails (an error from launch's step)
  int max_in_flight_seen = 0;

  Result<StepTicket> launch(std::span<const StepFeed> feeds) override {
    const int index = launched_;
    if (on_launch) on_launch(index);
    ++launched_;
    const bool pipe = pipelines_ && feeds.size() == 1 && feeds[0].tokens.size() == 1 && feeds[0].draw;
    if (!pipe) {  // a step that does not pipeline runs after those in flight
      for (auto& p : pending_) *p.out = p.drawn;
      pending_.clear();
    }
    Status st = index == fail_step ? errorf("fake: step {} fails", index) : run(feeds, pipe);
    const StepTicket t = ++tickets_;
    if (pipe && st) {
      pending_.back().ticket = t;
      max_in_flight_seen = std::max(max_in_flight_seen, int(pending_.size()));
      if (pending_.size() > 2) return errorf("fake: three steps in flight");
    } else {
      done_.add(t, std::move(st));
    }
    return t;
  }
  Status wait(StepTicket t) override {
    bool found = false;
    while (!pending_.empty() && pending_.front().ticket <= t) {
      found |= pending_.front().ticket == t;
      *pending_.front().out = pending_.front().drawn;
      pending_.erase(pending_.begin());
    }
    if (found) return Status::ok();
    if (auto st = done_.take(t)) return std::move(*st);
    return errorf("fake: wait for step {} that is not in flight", t);
  }

 protected:
  Status forward(SeqState&, std::span<const int32_t>, std::span<float>) override {
    return errorf("fake: forward is not used (launch is overridden)");
  }

 private:
  struct Pending {
    StepTicket ticket = 0;
    Drawn* out = nullptr;
    Drawn drawn;
  };
  Status run(std::span<const StepFeed> feeds, bool pipe) {
    LoggedStep ls;
    ls.pipelined = pipe;
    int tokens = 0;
    for (const StepFeed& f : feeds) {
      auto* s = dynamic_cast<State*>(f.state);
      if (!s) return errorf("fake: a state of another backend");
      if (s->n_tokens() + int(f.tokens.size()) > s->cap) return errorf("fake: a feed beyond the reserved room");
      LoggedFeed lf;
      lf.pos = s->n_tokens(), lf.len = int(f.tokens.size()), lf.out = f.logits || f.draw;
      for (int32_t t : f.tokens) {
        if (t == kDrawnToken) {
          if (!pipelines_ || s->last_draw < 0) return errorf("fake: kDrawnToken without a draw before it");
          t = s->last_draw;
        }
        if (t < 0 || t >= vocab_) return errorf("fake: token {} outside the vocabulary", t);
        s->toks.push_back(t);
        s->h = roll(s->h, t);
      }
      lf.first = s->toks.front();
      ls.feeds.push_back(lf);
      tokens += lf.len;
      const int32_t next = next_after(s->h);
      s->last_draw = -1;
      if (f.logits) {
        std::fill(f.logits, f.logits + vocab_, 0.0f);
        f.logits[next] = 20.0f;
      } else if (f.draw) {
        Drawn d;
        d.id = next;
        s->last_draw = next;
        if (pipe) pending_.push_back({0, f.drawn, d});
        else *f.drawn = d;
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    now_ms_ += cost_ms(tokens, int(feeds.size()));
    ls.t_end_ms = now_ms_;
    log_.push_back(std::move(ls));
    return Status::ok();
  }

  const int vocab_;
  const bool pipelines_;
  int launched_ = 0;
  StepTicket tickets_ = 0;
  std::vector<Pending> pending_;
  RanSteps done_;
  mutable std::mutex mu_;
  double now_ms_ = 0;
  std::vector<LoggedStep> log_;
};

}  // namespace lily::fake
