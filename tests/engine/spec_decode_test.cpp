// Speculative decoding (EngineOptions::spec_draft) on a tiny synthetic checkpoint (fast CPU backend, or
// LILY_BACKEND's: on CUDA a verify step is the mixed step and plain decoding the batch-1 graph, so
// logprobs agree within 1e-4 as batching_test's do, ids exactly):
// every reply equals plain decoding's, token for token (ids, logprobs, text, finish reason, usage),
// alone and with several requests in one step, at several draft lengths, under max_tokens and stop
// strings, and a follow-up continued from a state that was rewound equals the same follow-up without
// drafts. A random checkpoint's replies never repeat, so prompt lookup finds nothing to draft: the
// drafts come from the test hook (EngineOptions::spec_drafter), made from the plain replies with
// wrong tokens at moving places, so steps accept all, some and none of their drafts (the engine's
// counters say both happened; a near-zero row cost makes every step verify what it is offered, and
// one test checks the choice of draft length at the backend's cost). Prompt lookup itself is ngram_lookup_test's. One engine runs at a time
// (engines share the model and its thread pool; a reply's last event comes before its step ends).
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"
#include "reply_watch.h"
#include "text/tokenizer.h"
#include "tiny_checkpoint.h"

namespace lily {
namespace {

class SpecDecode : public TinySuite<SpecDecode, 5, true> {
 protected:

  // A known reply: prompt, then the plain reply's ids.
  using Run = std::pair<std::vector<int32_t>, std::vector<int32_t>>;

  // Drafts from the plain replies: for the run whose prompt and reply so far are the fed tokens (the
  // longest such prompt), with the pending token at reply position m, the reply's next tokens; by a
  // hash h of m: wrong at index 0 when h % 3 == 1 (none accepted), at index (h / 3) % max_len when
  // h % 3 == 2 (some), right when h % 3 == 0 (all); past the reply's end, token 3. No run: no drafts.
  static EngineOptions opts(int spec_draft, std::vector<Run> runs = {}) {
    EngineOptions eo;
    eo.max_seq = 512;
    eo.max_batch = 8;
    eo.spec_draft = spec_draft;
    eo.spec_ngram = 3;
    eo.spec_row_cost = 0.01;  // verify nearly every draft offered (SpecDecode.DraftLengthFollowsAcceptance tests the choice)
    eo.spec_step_cost = 0;
    const int V = model_->config().vocab_size;
    eo.spec_drafter = [runs = std::move(runs), V](std::span<const int32_t> fed, int32_t next, int max_len) {
      const Run* best = nullptr;
      for (const Run& r : runs) {
        const auto& [p, reply] = r;
        if (fed.size() < p.size() || fed.size() - p.size() >= reply.size() + 1) continue;
        if (!std::equal(p.begin(), p.end(), fed.begin())) continue;
        if (!std::equal(fed.begin() + ptrdiff_t(p.size()), fed.end(), reply.begin())) continue;
        if (!best || p.size() > best->first.size()) best = &r;
      }
      std::vector<int32_t> d;
      if (!best) return d;
      const auto& reply = best->second;
      const size_t m = fed.size() - best->first.size();
      if (m >= reply.size() || reply[m] != next) return d;
      for (int i = 0; i < max_len; ++i) d.push_back(m + 1 + size_t(i) < reply.size() ? reply[m + 1 + size_t(i)] : 3);
      const uint32_t h = uint32_t(m * 2654435761u) >> 7;  // a position's case, not periodic in m
      const int wrong = h % 3 == 1 ? 0 : h % 3 == 2 ? int(h / 3) % std::max(1, max_len) : -1;
      if (wrong >= 0 && wrong < max_len) d[size_t(wrong)] = (d[size_t(wrong)] + 1) % V;
      return d;
    };
    return eo;
  }

  static std::vector<Run> runs_of(const std::vector<std::vector<int32_t>>& prompts, const std::vector<Reply>& replies) {
    std::vector<Run> v;
    for (size_t i = 0; i < prompts.size(); ++i) {
      std::vector<int32_t> ids;
      for (const GenToken& t : replies[i].tokens) ids.push_back(t.id);
      v.emplace_back(prompts[i], ids);
    }
    return v;
  }

  static std::shared_ptr<GenRequest> greedy(const std::string& prompt, int max_tokens) {
    auto r = std::make_shared<GenRequest>();
    r->prompt = tok_->encode(prompt);
    r->max_tokens = max_tokens;
    r->sampling.temperature = 0;
    r->sampling.top_logprobs = 2;
    return r;
  }

  // Submits every request at once (they share steps) and waits for all replies.
  static std::vector<Reply> run_all(Engine& e, const std::vector<std::shared_ptr<GenRequest>>& reqs) {
    std::vector<std::shared_ptr<Reply>> out;
    for (const auto& r : reqs) {
      out.push_back(watch(*r));
      EXPECT_TRUE(e.submit(r));
    }
    std::vector<Reply> v;
    for (auto& r : out) {
      r->done.wait();
      v.push_back(*r);
    }
    return v;
  }
  static Reply run_one(Engine& e, std::shared_ptr<GenRequest> r) { return run_all(e, {std::move(r)})[0]; }

  static void expect_same(const Reply& a, const Reply& b, const std::string& what) {
    ASSERT_EQ(a.tokens.size(), b.tokens.size()) << what;
    for (size_t i = 0; i < a.tokens.size(); ++i) {
      EXPECT_EQ(a.tokens[i].id, b.tokens[i].id) << what << ", token " << i;
      if (std::string(model_->backend_name()) == "cuda") {
        ASSERT_TRUE(a.tokens[i].logprob && b.tokens[i].logprob) << what << ", token " << i;
        EXPECT_NEAR(*a.tokens[i].logprob, *b.tokens[i].logprob, 1e-4) << what << ", token " << i;
      } else {
        EXPECT_EQ(a.tokens[i].logprob, b.tokens[i].logprob) << what << ", token " << i;
      }
      ASSERT_EQ(a.tokens[i].top.size(), b.tokens[i].top.size()) << what << ", token " << i;
      for (size_t j = 0; j < a.tokens[i].top.size(); ++j)
        EXPECT_EQ(a.tokens[i].top[j].id, b.tokens[i].top[j].id) << what << ", token " << i;
    }
    EXPECT_EQ(a.text, b.text) << what;
    EXPECT_EQ(a.last.finish, b.last.finish) << what;
    EXPECT_EQ(a.last.usage.completion_tokens, b.last.usage.completion_tokens) << what;
    EXPECT_EQ(a.last.stop_string, b.last.stop_string) << what;
  }

  static inline const std::vector<std::string> kPrompts = {
      "one two three four one two three four one two three four one two",
      "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef",
      "The quick brown fox jumps over the lazy dog. The quick brown fox",
      "Hello",
      "a b a b a b a b a b a b",
  };

};

TEST_F(SpecDecode, SameRepliesAsPlainDecoding) {
  if (!model_->speculates()) GTEST_SKIP() << "backend " << model_->backend_name() << " does not speculate on this checkpoint";
  ASSERT_TRUE(model_->speculates());
  std::vector<Reply> want;
  std::vector<std::vector<int32_t>> prompts;
  {
    Engine plain(*model_, *tok_, opts(0));
    for (const auto& p : kPrompts) want.push_back(run_one(plain, greedy(p, 40))), prompts.push_back(tok_->encode(p));
    EXPECT_EQ(plain.stats().spec_rows.load(), 0u);
  }
  {  // Prompt lookup on its own finds nothing in these random replies: no drafts, the same replies.
    Engine lookup(*model_, *tok_, [] { auto o = opts(4); o.spec_drafter = nullptr; return o; }());
    for (size_t i = 0; i < kPrompts.size(); ++i) expect_same(run_one(lookup, greedy(kPrompts[i], 40)), want[i], "lookup");
  }
  uint64_t accepted = 0, drafted = 0;
  for (int k : {2, 6}) {
    Engine spec(*model_, *tok_, opts(k, runs_of(prompts, want)));
    for (size_t i = 0; i < kPrompts.size(); ++i)
      expect_same(run_one(spec, greedy(kPrompts[i], 40)), want[i], "alone, draft " + std::to_string(k) + ", prompt " + std::to_string(i));
    // All at once: verify feeds beside each other's decode rows and prompt segments.
    std::vector<std::shared_ptr<GenRequest>> reqs;
    for (const auto& p : kPrompts) reqs.push_back(greedy(p, 40));
    const std::vector<Reply> got = run_all(spec, reqs);
    for (size_t i = 0; i < kPrompts.size(); ++i)
      expect_same(got[i], want[i], "batched, draft " + std::to_string(k) + ", prompt " + std::to_string(i));
    accepted += spec.stats().spec_accepted, drafted += spec.stats().spec_drafted;
    EXPECT_LE(spec.stats().spec_accepted.load(), spec.stats().spec_drafted.load());
    // Fewer steps than tokens: drafts were delivered.
    EXPECT_LT(spec.stats().decode_steps.load(), 2 * 40 * kPrompts.size()) << "draft " << k;
  }
  // The comparison covered both outcomes of a draft.
  EXPECT_GT(accepted, 0u) << "no draft was accepted: the test did not exercise speculation";
  EXPECT_GT(drafted, accepted) << "no draft was rejected: the test did not exercise a rewind";
  std::printf("spec decode: %llu of %llu drafts accepted\n", (unsigned long long)accepted, (unsigned long long)drafted);
}

TEST_F(SpecDecode, MaxTokensAndStopStringsAsPlain) {
  if (!model_->speculates()) GTEST_SKIP() << "backend " << model_->backend_name() << " does not speculate on this checkpoint";
  const std::string p = kPrompts[0];
  // The requests: max_tokens 1..9, then stop strings taken from inside the plain reply (they end it
  // mid-way, where a draft may be in flight), then a seeded sampled one (which does not speculate).
  std::vector<std::shared_ptr<GenRequest>> reqs;
  std::vector<std::string> what;
  for (int n = 1; n <= 9; ++n) reqs.push_back(greedy(p, n)), what.push_back("max_tokens " + std::to_string(n));
  Reply full;
  std::vector<Reply> want;
  auto copy = [](const std::shared_ptr<GenRequest>& r) {
    auto c = greedy("", r->max_tokens);
    c->prompt = r->prompt, c->stop = r->stop, c->sampling = r->sampling;
    return c;
  };
  {
    Engine plain(*model_, *tok_, opts(0));
    full = run_one(plain, greedy(p, 40));
    ASSERT_GE(full.text.size(), 12u);
    for (size_t at : {size_t(3), full.text.size() / 2, full.text.size() - 4}) {
      reqs.push_back(greedy(p, 40)), reqs.back()->stop = {full.text.substr(at, 3)};
      what.push_back("stop string at " + std::to_string(at));
    }
    reqs.push_back(greedy(p, 20)), reqs.back()->sampling.temperature = 0.8f, reqs.back()->sampling.seed = 7;
    what.push_back("seeded");
    for (const auto& r : reqs) want.push_back(run_one(plain, copy(r)));
  }
  Engine spec(*model_, *tok_, opts(4, runs_of({tok_->encode(p)}, {full})));
  for (size_t i = 0; i + 1 < reqs.size(); ++i) expect_same(run_one(spec, copy(reqs[i])), want[i], what[i]);
  const uint64_t rows = spec.stats().spec_rows;
  EXPECT_GT(rows, 0u);
  expect_same(run_one(spec, copy(reqs.back())), want.back(), what.back());
  EXPECT_EQ(spec.stats().spec_rows.load(), rows) << "a sampled request speculated";
}

TEST_F(SpecDecode, DraftLengthFollowsAcceptance) {
  if (!model_->speculates()) GTEST_SKIP() << "backend " << model_->backend_name() << " does not speculate on this checkpoint";
  // At a backend's costs (the fast CPU's 0.75 a row; CUDA's 0.9 a verify step + 0.25 a row), and at
  // costly verify steps (1.8 + 0.2 a row) on any backend, drafts that are always right are verified in full once the acceptance
  // estimate has risen; drafts whose first token is always wrong stop being fed after the first misses,
  // or are never fed where a verify step costs more than the estimate's first drafts bring (their first
  // token is still checked against the token drawn); the replies stay plain decoding's.
  const std::string p = kPrompts[2];
  Reply want;
  {
    Engine plain(*model_, *tok_, opts(0));
    want = run_one(plain, greedy(p, 40));
  }
  ASSERT_EQ(want.tokens.size(), 40u);
  std::vector<int32_t> ids;
  for (const GenToken& t : want.tokens) ids.push_back(t.id);
  const size_t plen = tok_->encode(p).size();
  const int V = model_->config().vocab_size;
  for (int costs = 0; costs < 4; ++costs) {
    const bool right = costs % 2 == 0;
    SCOPED_TRACE(costs < 2 ? "the backend's costs" : "1.8 a step + 0.2 a row");
    EngineOptions eo = opts(4);
    if (costs < 2) eo.spec_row_cost = 0, eo.spec_step_cost = -1;  // the backend's
    else eo.spec_row_cost = 0.2, eo.spec_step_cost = 1.8;
    eo.spec_drafter = [&, right](std::span<const int32_t> fed, int32_t, int max_len) {
      std::vector<int32_t> d;
      for (size_t i = fed.size() - plen + 1; i < ids.size() && int(d.size()) < max_len; ++i) d.push_back(ids[i]);
      if (!right && !d.empty()) d[0] = (d[0] + 1) % V;
      return d;
    };
    Engine spec(*model_, *tok_, eo);
    expect_same(run_one(spec, greedy(p, 40)), want, right ? "right drafts" : "wrong drafts");
    const auto& st = spec.stats();
    if (right) {
      EXPECT_EQ(st.spec_accepted.load(), st.spec_drafted.load());
      EXPECT_LE(st.decode_steps.load(), 20u) << "39 decode tokens, in steps of up to 5 once the estimate has risen";
    } else {
      EXPECT_EQ(st.spec_accepted.load(), 0u);
      // The decayed acceptance estimate falls below the row cost after a few steps: 1 draft fed at the
      // fast CPU's costs (0.75 a row), 4 at CUDA's (0.9 + 0.25 a row), none at 1.8 + 0.2 a row; 156 if never stopped.
      EXPECT_LE(st.spec_drafted.load(), 16u) << "wrong drafts kept being fed";
      if (costs >= 2) {
        EXPECT_EQ(st.spec_drafted.load(), 0u) << "a verify step that never pays was run";
      }
      EXPECT_GE(st.decode_steps.load(), 39u);
    }
  }
}

TEST_F(SpecDecode, FollowUpFromARewoundStateAsPlain) {
  if (!model_->speculates()) GTEST_SKIP() << "backend " << model_->backend_name() << " does not speculate on this checkpoint";
  // The same two turns with and without drafts; the second continues the first's cached state, which
  // the speculating engine rewound along the way: same replies, bit for bit.
  std::vector<int32_t> p2;
  auto conversation = [&](Engine& e) {
    auto first = greedy(kPrompts[1], 30);
    first->cache_key = "conv";
    const Reply a = run_one(e, first);
    p2 = tok_->encode(kPrompts[1]);
    for (const GenToken& t : a.tokens) p2.push_back(t.id);
    for (int32_t id : tok_->encode(" more words")) p2.push_back(id);
    auto second = std::make_shared<GenRequest>();
    second->prompt = p2, second->max_tokens = 20, second->sampling.temperature = 0, second->sampling.top_logprobs = 2;
    second->cache_key = "conv";
    return std::make_pair(a, run_one(e, second));
  };
  std::pair<Reply, Reply> plain_turns;
  {
    Engine plain(*model_, *tok_, opts(0));
    plain_turns = conversation(plain);
  }
  const auto& [pa, pb] = plain_turns;
  Engine spec(*model_, *tok_, opts(5, runs_of({tok_->encode(kPrompts[1]), p2}, {pa, pb})));
  const auto [sa, sb] = conversation(spec);
  ASSERT_GT(spec.stats().spec_drafted.load(), spec.stats().spec_accepted.load()) << "no rewind happened";
  EXPECT_GT(sb.last.usage.cached_tokens, 0) << "the follow-up did not continue the cached state";
  EXPECT_EQ(sb.last.usage.cached_tokens, pb.last.usage.cached_tokens);
  expect_same(sa, pa, "first turn");
  expect_same(sb, pb, "follow-up");
}

}  // namespace
}  // namespace lily
