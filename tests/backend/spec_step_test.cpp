// Speculative decoding's backend half (StepFeed::outputs / rewindable, Model::rewind) against plain
// decoding on the same backend, on the first golden checkpoint: the fast CPU backend, and LILY_BACKEND's
// if set (cuda: the verify feed is a segment of the mixed step, plain decoding the batch-1 graph):
// - a verify feed (a token and k drafts, an output for each) gives at every position the logits and
//   the draw that feeding the same tokens one decode step at a time gives, alone and beside other
//   decode rows and a prompt segment: on the CPU bit for bit (each row is computed as a decode row); on
//   CUDA within the mixed step's tolerance against the batch-1 graph (model_step_test's: 2e-3 + 2e-3·|x|
//   in logits; the greedy id equal unless the plain logits put another id within 4× that);
// - rewinding it to any number of kept tokens leaves the state that feeding only those tokens gives:
//   the next two decode steps' logits equal (bit for bit on the CPU; CUDA: the same tolerance), so
//   DeltaNet states, conv windows and K/V caches were restored;
// - rewind is refused, the state unchanged, where it cannot hold; backends that do not speculate
//   refuse verify feeds.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "golden_dirs.h"
#include "model/draw.h"
#include "model/model.h"

namespace lily {
namespace {

std::vector<int32_t> toks(int seed, int len, int V) {
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(int32_t((uint64_t(i * 7 + 131 * seed + 1) * 2654435761u) % uint32_t(V)));
  return p;
}

std::unique_ptr<Model> load(const std::string& backend) { return load_quiet(first_golden(), backend); }

std::unique_ptr<SeqState> state_after(Model& m, const std::vector<int32_t>& prompt) {
  auto st = m.new_state(512);
  EXPECT_TRUE(st.is_ok()) << st.message();
  EXPECT_TRUE(m.forward(**st, prompt, {}).is_ok());
  return std::move(st).value();
}

// Logits of feeding `t` one decode step at a time.
std::vector<std::vector<float>> decode_each(Model& m, SeqState& st, const std::vector<int32_t>& t) {
  const size_t V = size_t(m.config().vocab_size);
  std::vector<std::vector<float>> out;
  for (int32_t x : t) {
    out.emplace_back(V);
    EXPECT_TRUE(m.forward(st, std::vector<int32_t>{x}, out.back()).is_ok());
  }
  return out;
}

std::vector<std::string> backends() { return test_backends(); }

// Logits equal: bit for bit where tol is 0, else every entry within tol + tol·|want|.
bool close(const float* got, const float* want, size_t n, double tol) {
  if (tol == 0) return std::memcmp(got, want, n * sizeof(float)) == 0;
  for (size_t i = 0; i < n; ++i)
    if (!(std::fabs(double(got[i]) - double(want[i])) <= tol + tol * std::fabs(double(want[i])))) return false;
  return true;
}

// A draw from a verify row against the draw from plain decoding's logits `ref`: the same id (or, within
// a tolerance, an id the plain logits put within 4× of it), the logprob within it.
void expect_draw(const Drawn& got, const Drawn& want, const std::vector<float>& ref, double tol, const std::string& what) {
  if (tol == 0) {
    EXPECT_EQ(got.id, want.id) << what;
    EXPECT_EQ(got.logprob, want.logprob) << what;
    return;
  }
  if (got.id != want.id) {
    const double gap = std::fabs(double(ref[size_t(want.id)]) - double(ref[size_t(got.id)]));
    EXPECT_LE(gap, 4 * (tol + tol * std::fabs(double(ref[size_t(want.id)])))) << what << ": a different id without a near-tie";
    return;
  }
  EXPECT_NEAR(got.logprob, want.logprob, tol + tol * std::fabs(double(want.logprob))) << what;
}

void verify_and_rewind(const std::string& backend) {
  SCOPED_TRACE("backend " + backend);
  const double tol = backend == "cuda" ? 2e-3 : 0.0;
  auto m = load(backend);
  ASSERT_TRUE(m);
  ASSERT_TRUE(m->speculates());
  const int V = m->config().vocab_size;
  const size_t Vs = size_t(V);
  for (int plen : {9, 70}) {  // a prompt inside the first 64-token chunk, one across it
    const std::vector<int32_t> prompt = toks(plen, plen, V);
    for (int k = 1; k <= 5; ++k) {
      const std::vector<int32_t> in = toks(100 + k, k + 1, V);  // the row's token and k drafts
      auto plain = state_after(*m, prompt);
      const auto want = decode_each(*m, *plain, in);
      // Logits of the verify feed.
      auto ver = state_after(*m, prompt);
      std::vector<float> got(Vs * in.size());
      StepFeed f;
      f.state = ver.get(), f.tokens = in, f.logits = got.data(), f.outputs = int(in.size()), f.rewindable = true;
      ASSERT_TRUE(m->step({&f, 1}).is_ok());
      EXPECT_EQ(ver->n_tokens(), plen + k + 1);
      for (size_t i = 0; i < in.size(); ++i)
        EXPECT_TRUE(close(got.data() + i * Vs, want[i].data(), Vs, tol)) << "prompt " << plen << ", k " << k << ", output " << i;
      // Draws of the verify feed (greedy, with logprobs), beside a decode row and a prompt segment.
      auto other = state_after(*m, toks(7, 12, V)), other_alone = state_after(*m, toks(7, 12, V));
      auto seg = state_after(*m, toks(8, 5, V)), seg_alone = state_after(*m, toks(8, 5, V));
      auto ver2 = state_after(*m, prompt);
      DrawSpec greedy;
      greedy.top_logprobs = 3;
      std::vector<Drawn> d(in.size());
      const std::vector<int32_t> one = {42}, segt = toks(9, 20, V);
      std::vector<float> l_other(Vs), l_seg(Vs);
      StepFeed fs[3];
      fs[0].state = seg.get(), fs[0].tokens = segt, fs[0].logits = l_seg.data();
      fs[1].state = ver2.get(), fs[1].tokens = in, fs[1].draw = &greedy, fs[1].drawn = d.data();
      fs[1].outputs = int(in.size()), fs[1].rewindable = true;
      fs[2].state = other.get(), fs[2].tokens = one, fs[2].logits = l_other.data();
      ASSERT_TRUE(m->step(fs).is_ok());
      for (size_t i = 0; i < in.size(); ++i) {
        Drawn w;
        std::vector<float> ws;
        std::vector<double> sums;
        draw_row(want[i], greedy, w, ws, sums);
        expect_draw(d[i], w, want[i], tol, "prompt " + std::to_string(plen) + ", k " + std::to_string(k) + ", output " + std::to_string(i));
      }
      std::vector<float> a(Vs);
      ASSERT_TRUE(m->forward(*other_alone, one, a).is_ok());
      EXPECT_TRUE(close(l_other.data(), a.data(), Vs, tol)) << "a decode row beside a verify feed";
      ASSERT_TRUE(m->forward(*seg_alone, segt, a).is_ok());
      EXPECT_TRUE(close(l_seg.data(), a.data(), Vs, tol)) << "a prompt segment beside a verify feed";
      // Rewind to every number of kept tokens (1..k: the token and keep - 1 drafts; k + 1 keeps all).
      for (int keep = 1; keep <= k + 1; ++keep) {
        auto s = state_after(*m, prompt);
        std::vector<float> tmp(Vs * in.size());
        StepFeed g;
        g.state = s.get(), g.tokens = in, g.logits = tmp.data(), g.outputs = int(in.size()), g.rewindable = true;
        ASSERT_TRUE(m->step({&g, 1}).is_ok());
        ASSERT_TRUE(m->rewind(*s, plen + keep).is_ok());
        EXPECT_EQ(s->n_tokens(), plen + keep);
        auto ref = state_after(*m, prompt);
        decode_each(*m, *ref, std::vector<int32_t>(in.begin(), in.begin() + keep));
        const std::vector<int32_t> next = {int32_t(5 + keep), int32_t(11 * keep % V)};
        const auto after_rewind = decode_each(*m, *s, next), after_plain = decode_each(*m, *ref, next);
        for (size_t i = 0; i < next.size(); ++i)
          EXPECT_TRUE(close(after_rewind[i].data(), after_plain[i].data(), Vs, tol))
              << "prompt " << plen << ", k " << k << ", keep " << keep << ", step " << i << " after the rewind";
      }
    }
  }
}

TEST(SpecStep, VerifyRowsEqualPlainDecodeAndRewindToAnyPoint) {
  if (first_golden().empty()) GTEST_SKIP() << "no checkpoints under tests/data/golden";
  for (const std::string& b : backends()) verify_and_rewind(b);
}

void refused(const std::string& backend) {
  SCOPED_TRACE("backend " + backend);
  auto m = load(backend);
  ASSERT_TRUE(m);
  const int V = m->config().vocab_size;
  auto s = state_after(*m, toks(1, 10, V));
  Status r = m->rewind(*s, 8);  // its last step was a prompt, not a rewindable feed
  EXPECT_FALSE(r.is_ok());
  EXPECT_EQ(s->n_tokens(), 10);
  const std::vector<int32_t> in = toks(2, 4, V);
  StepFeed f;
  f.state = s.get(), f.tokens = in, f.outputs = 4, f.rewindable = true;
  ASSERT_TRUE(m->step({&f, 1}).is_ok());
  EXPECT_FALSE(m->rewind(*s, 9).is_ok()) << "before the rewindable step's start";
  EXPECT_FALSE(m->rewind(*s, 15).is_ok()) << "beyond the state";
  EXPECT_EQ(s->n_tokens(), 14);
  EXPECT_TRUE(m->rewind(*s, 14).is_ok()) << "to where it is: nothing to do";
  ASSERT_TRUE(m->forward(*s, std::vector<int32_t>{3}, {}).is_ok());
  r = m->rewind(*s, 12);  // a later step forgot the undo
  EXPECT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("rewindable"), std::string::npos) << r.message();
  EXPECT_EQ(s->n_tokens(), 15);
  // outputs out of range.
  f.outputs = 5;
  EXPECT_FALSE(m->step({&f, 1}).is_ok());
  EXPECT_EQ(s->n_tokens(), 15);
  // More verify feeds in one step than the backend takes.
  const int most = m->spec_max_feeds();
  if (most < 64) {
    std::vector<std::unique_ptr<SeqState>> sts;
    std::vector<StepFeed> fs(size_t(most) + 1);
    for (auto& g : fs) {
      sts.push_back(state_after(*m, toks(3, 10, V)));
      g.state = sts.back().get(), g.tokens = in, g.outputs = 2, g.rewindable = true;
    }
    Status too_many = m->step(fs);
    EXPECT_FALSE(too_many.is_ok());
    EXPECT_EQ(sts[0]->n_tokens(), 10);
  }
}

TEST(SpecStep, RewindRefusedWhereItCannotHold) {
  if (first_golden().empty()) GTEST_SKIP() << "no checkpoints under tests/data/golden";
  for (const std::string& b : backends()) refused(b);
  const int V = load("cpu")->config().vocab_size;
  const std::vector<int32_t> in = toks(2, 4, V);

  // The reference backend does not speculate: verify feeds and rewinds are refused.
  auto ref = load("cpu-ref");
  ASSERT_TRUE(ref);
  EXPECT_FALSE(ref->speculates());
  auto t = state_after(*ref, toks(1, 3, V));
  StepFeed g;
  g.state = t.get(), g.tokens = in, g.outputs = 2;
  Status st = ref->step({&g, 1});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("does not speculate"), std::string::npos) << st.message();
  EXPECT_EQ(t->n_tokens(), 3);
  g.outputs = 1, g.rewindable = false;
  ASSERT_TRUE(ref->step({&g, 1}).is_ok());
  EXPECT_FALSE(ref->rewind(*t, 4).is_ok());
}

}  // namespace
}  // namespace lily
