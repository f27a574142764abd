// Engine on a tiny synthetic checkpoint: a follow-up prompt continued from the prefix cache
// gives the same greedy tokens and logprobs as a fresh prefill of the whole prompt; cancel
// stops a request between steps; stop strings and forced output behave as documented.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>

#include <unistd.h>

#include "engine/engine.h"
#include "tiny_checkpoint.h"
#include "model/draw.h"
#include "model/model.h"
#include "reply_watch.h"
#include "text/tokenizer.h"

namespace lily {
namespace {

class EngineTest : public TinySuite<EngineTest, 3, false> {
 protected:

  static Reply run(Engine& e, std::shared_ptr<GenRequest> req, int cancel_after_n = -1) {
    auto out = watch(*req, cancel_after_n >= 0 ? cancel_after(*req, cancel_after_n) : nullptr);
    EXPECT_TRUE(e.submit(req));
    out->done.wait();
    return *out;
  }

  static std::shared_ptr<GenRequest> greedy(std::vector<int32_t> prompt, int max_tokens) {
    auto r = std::make_shared<GenRequest>();
    r->prompt = std::move(prompt);
    r->max_tokens = max_tokens;
    r->sampling.temperature = 0;
    r->sampling.top_logprobs = 0;
    return r;
  }

};

TEST_F(EngineTest, CachedFollowUpEqualsFreshPrefill) {
  EngineOptions eo;
  eo.max_seq = 256;
  eo.prefill_chunk = 7;  // several chunks, to cover chunked prefill too
  Engine cached(*model_, *tok_, eo);
  std::vector<int32_t> p1 = tok_->encode("The quick brown fox jumps over the lazy dog.");
  Reply a = run(cached, greedy(p1, 6));
  ASSERT_EQ(a.last.finish == FinishReason::kStop || a.last.finish == FinishReason::kLength, true);
  std::vector<int32_t> p2 = p1;
  for (const auto& t : a.tokens) p2.push_back(t.id);
  for (int32_t id : tok_->encode(" And then some more words.")) p2.push_back(id);
  Reply b = run(cached, greedy(p2, 8));
  EXPECT_EQ(b.last.usage.cached_tokens, int(p1.size() + a.tokens.size()) - 1);
  EXPECT_EQ(b.last.usage.prompt_tokens, int(p2.size()));

  EngineOptions fresh_opts = eo;
  fresh_opts.prefill_chunk = 512;
  Engine fresh(*model_, *tok_, fresh_opts);
  Reply c = run(fresh, greedy(p2, 8));
  EXPECT_EQ(c.last.usage.cached_tokens, 0);
  ASSERT_EQ(b.tokens.size(), c.tokens.size());
  double max_diff = 0;
  for (size_t i = 0; i < b.tokens.size(); ++i) max_diff = std::max(max_diff, double(std::abs(*b.tokens[i].logprob - *c.tokens[i].logprob)));
  std::printf("cached vs fresh: max logprob difference %.3g\n", max_diff);
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    EXPECT_EQ(b.tokens[i].id, c.tokens[i].id) << "step " << i;
    EXPECT_NEAR(*b.tokens[i].logprob, *c.tokens[i].logprob, 2e-3) << "step " << i;
  }
  EXPECT_EQ(cached.stats().cache_hits.load(), 1u);
}

TEST_F(EngineTest, SnapshotInsidePromptIsReused) {
  EngineOptions eo;
  eo.max_seq = 256;
  Engine e(*model_, *tok_, eo);
  std::vector<int32_t> p1 = tok_->encode("One two three four five six seven eight");
  auto r1 = greedy(p1, 2);
  r1->snapshot_at = 5;
  Reply a = run(e, r1);
  // A prompt that shares only the first 5 tokens continues from the snapshot.
  std::vector<int32_t> p2(p1.begin(), p1.begin() + 5);
  for (int32_t id : tok_->encode(" nine ten")) p2.push_back(id);
  Reply b = run(e, greedy(p2, 3));
  EXPECT_EQ(b.last.usage.cached_tokens, 5);
  Engine fresh(*model_, *tok_, eo);
  Reply c = run(fresh, greedy(p2, 3));
  ASSERT_EQ(b.tokens.size(), c.tokens.size());
  for (size_t i = 0; i < b.tokens.size(); ++i) EXPECT_EQ(b.tokens[i].id, c.tokens[i].id);
}

TEST_F(EngineTest, SharedHeadIsCopiedForEveryRequest) {
  // Three conversations share a head (a system prompt, say): the first stores one snapshot there,
  // the next two each continue from a copy of it, and all give the tokens of a fresh prefill.
  EngineOptions eo;
  eo.max_seq = 256;
  eo.prefill_chunk = 5;
  eo.shared_prefix_min = 4;
  Engine e(*model_, *tok_, eo);
  const std::vector<int32_t> head = tok_->encode("You are a careful assistant who answers briefly.");
  ASSERT_GE(head.size(), 6u);
  const char* tails[] = {" What is two plus two?", " Name a colour.", " Say hello."};
  EngineOptions fresh_opts = eo;
  fresh_opts.shared_prefix_min = 1 << 30;  // never snapshots
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p = head;
    for (int32_t id : tok_->encode(tails[i])) p.push_back(id);
    auto r = greedy(p, 5);
    r->shared_prefix_at = int(head.size());
    Reply a = run(e, r);
    EXPECT_EQ(a.last.usage.cached_tokens, i == 0 ? 0 : int(head.size())) << i;
    Engine fresh(*model_, *tok_, fresh_opts);
    auto rf = greedy(p, 5);
    rf->shared_prefix_at = int(head.size());
    Reply b = run(fresh, rf);
    EXPECT_EQ(b.last.usage.cached_tokens, 0);
    ASSERT_EQ(a.tokens.size(), b.tokens.size()) << i;
    for (size_t k = 0; k < a.tokens.size(); ++k) {
      EXPECT_EQ(a.tokens[k].id, b.tokens[k].id) << i << " step " << k;
      EXPECT_NEAR(*a.tokens[k].logprob, *b.tokens[k].logprob, 2e-3) << i << " step " << k;
    }
  }
  EXPECT_EQ(e.stats().cache_hits.load(), 2u);
  // A head shorter than shared_prefix_min is not snapshotted.
  EngineOptions strict = eo;
  strict.shared_prefix_min = int(head.size()) + 1;
  Engine s(*model_, *tok_, strict);
  for (int i = 0; i < 2; ++i) {
    std::vector<int32_t> p = head;
    for (int32_t id : tok_->encode(tails[i])) p.push_back(id);
    auto r = greedy(p, 2);
    r->shared_prefix_at = int(head.size());
    EXPECT_EQ(run(s, r).last.usage.cached_tokens, 0) << i;
  }
}

TEST_F(EngineTest, ShortTailFedByDecodeStepsEqualsPrefill) {
  // A snapshot cut two tokens before the end of the prompt leaves a tail that goes through decode
  // steps (one token a step, nothing drawn for the first) instead of a prefill forward: the reply
  // is the one a prefill of the whole tail gives, seeded draws included.
  std::vector<int32_t> p = tok_->encode("Seven eight nine ten eleven twelve thirteen");
  ASSERT_GE(p.size(), 5u);
  for (int seeded = 0; seeded < 2; ++seeded) {
    Reply out[2];
    uint64_t rows[2];
    for (int tail = 0; tail < 2; ++tail) {
      EngineOptions eo;
      eo.max_seq = 256;
      eo.decode_tail = tail ? 4 : 0;
      Engine e(*model_, *tok_, eo);
      auto r = greedy(p, 6);
      r->stop.clear();
      r->snapshot_at = int(p.size()) - 2;
      r->sampling.top_logprobs = 2;
      if (seeded) r->sampling.temperature = 0.9f, r->sampling.seed = 42;
      out[tail] = run(e, r);
      rows[tail] = e.stats().decode_rows.load();
    }
    ASSERT_EQ(out[0].tokens.size(), 6u);
    ASSERT_EQ(out[1].tokens.size(), 6u);
    EXPECT_EQ(rows[1], rows[0] + 2) << "the two tail tokens were not fed by decode steps";
    for (size_t k = 0; k < 6; ++k) {
      EXPECT_EQ(out[1].tokens[k].id, out[0].tokens[k].id) << seeded << " step " << k;
      EXPECT_NEAR(*out[1].tokens[k].logprob, *out[0].tokens[k].logprob, 2e-3) << seeded << " step " << k;
    }
  }
}

// The first reply token after a prompt's last segment is drawn by the backend where the logits are when
// the request allows (as a decode row's), else sampled on the host from the segment's logits row. A request
// asking for more log-probabilities than a backend draws (kMaxDrawTop) takes the host path throughout: the
// same seed must give the same reply either way, at one request and at several that share steps.
TEST_F(EngineTest, SegmentDrawEqualsHostSampling) {
  std::vector<int32_t> p = tok_->encode("One two three four five six seven eight nine ten");
  ASSERT_GE(p.size(), 6u);
  for (int n : {1, 3}) {
    Reply out[2][3];
    for (int host = 0; host < 2; ++host) {
      EngineOptions eo;
      eo.max_seq = 256;
      eo.max_batch = 4;
      Engine e(*model_, *tok_, eo);
      std::vector<std::shared_ptr<Reply>> replies;
      for (int i = 0; i < n; ++i) {
        auto r = greedy(std::vector<int32_t>(p.begin(), p.end() - i), 5);
        r->stop.clear();
        r->sampling.temperature = 0.9f, r->sampling.top_p = 0.95f, r->sampling.seed = 7 + uint64_t(i);
        r->sampling.top_logprobs = host ? kMaxDrawTop + 1 : 2;
        replies.push_back(watch(*r));
        ASSERT_TRUE(e.submit(r));
      }
      for (int i = 0; i < n; ++i) replies[size_t(i)]->done.wait(), out[host][i] = *replies[size_t(i)];
    }
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(out[0][i].tokens.size(), 5u) << n << " " << i;
      ASSERT_EQ(out[1][i].tokens.size(), 5u) << n << " " << i;
      for (size_t k = 0; k < 5; ++k) {
        EXPECT_EQ(out[0][i].tokens[k].id, out[1][i].tokens[k].id) << "requests " << n << " #" << i << " token " << k;
        EXPECT_NEAR(*out[0][i].tokens[k].logprob, *out[1][i].tokens[k].logprob, 1e-5) << n << " #" << i << " token " << k;
      }
      EXPECT_EQ(out[0][i].text, out[1][i].text);
    }
  }
}

TEST_F(EngineTest, CancelStopsBetweenSteps) {
  EngineOptions eo;
  eo.max_seq = 256;
  Engine e(*model_, *tok_, eo);
  auto r = greedy(tok_->encode("Count to one hundred:"), 200);
  r->stop.clear();
  Reply out = run(e, r, /*cancel_after=*/3);
  EXPECT_EQ(out.last.finish, FinishReason::kCancelled);
  EXPECT_LE(out.tokens.size(), 4u);
  // The engine is free for the next request.
  Reply next = run(e, greedy(tok_->encode("Hi"), 2));
  EXPECT_EQ(next.tokens.size(), 2u);
}

TEST_F(EngineTest, QueueLimitCountsOnlyRequestsBeyondFreeSlots) {
  // Two requests submitted at once to an idle engine with two slots and no waiting room are both
  // taken (the worker may not have picked the first up yet); a third, while both run, is refused.
  EngineOptions eo;
  eo.max_seq = 256;
  eo.max_batch = 2;
  eo.max_queue = 0;
  for (int rep = 0; rep < 8; ++rep) {
    Engine e(*model_, *tok_, eo);
    std::vector<std::shared_ptr<Reply>> replies;
    std::vector<std::shared_ptr<GenRequest>> reqs;
    for (int i = 0; i < 3; ++i) {
      auto r = greedy(tok_->encode("Count slowly:"), 12);
      r->step_delay_ms = 5;
      replies.push_back(watch(*r));
      reqs.push_back(r);
    }
    ASSERT_TRUE(e.submit(reqs[0])) << rep;
    ASSERT_TRUE(e.submit(reqs[1])) << rep;
    EXPECT_FALSE(e.submit(reqs[2])) << rep;
    for (int i = 0; i < 2; ++i) replies[size_t(i)]->done.wait();
  }
}

TEST_F(EngineTest, ForcedOutputAndStopStrings) {
  EngineOptions eo;
  eo.max_seq = 256;
  Engine e(*model_, *tok_, eo);
  auto r = greedy(tok_->encode("Say it"), 50);
  r->forced_output = tok_->encode("alpha beta STOP gamma");
  r->stop = {"STOP"};
  Reply out = run(e, r);
  EXPECT_EQ(out.text, "alpha beta ");
  EXPECT_EQ(out.last.finish, FinishReason::kStop);
  auto r2 = greedy(tok_->encode("Say it"), 50);
  r2->forced_output = tok_->encode("alpha beta");
  Reply out2 = run(e, r2);
  EXPECT_EQ(out2.text, "alpha beta");
  EXPECT_EQ(out2.last.finish, FinishReason::kStop);
  EXPECT_EQ(out2.last.usage.completion_tokens, int(r2->forced_output.size()));
}

}  // namespace
}  // namespace lily
