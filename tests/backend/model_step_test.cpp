// Model::step (one serving step: decode rows and prompt segments together) against forward() on
// each sequence alone, on the first golden checkpoint: sequences at different positions (fresh
// states, short and long contexts) feed segments of 2..130 tokens and single decode tokens in one
// step, asking for nothing, logits, or a device draw (greedy and at a temperature, with logprobs).
// Then every sequence decodes one token in a batched step and one more alone, so the states the
// mixed step left (K/V caches, conv windows, DeltaNet states, the decode graph's position) are
// checked too. Backends: cpu (Backend::step: forwards, then one batched decode step), and
// LILY_BACKEND's if set (cuda: the segments' tokens are rows of the batched step, batch.cu).
// Stated tolerance: every logit within 1e-5 + 1e-6·|alone| on the CPU; on CUDA, where the step's
// tensor-core GEMMs round differently from the prefill's and the batch-1 GEMVs, 2e-3 + 2e-3·|alone|
// (as forward_batch_test), the argmax agreeing where its margin exceeds that, and draws equal to
// draw_row on the alone logits (the id, where the draw is not within the tolerance of a boundary;
// logprobs within the same tolerance).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "model/draw.h"
#include "model/model.h"
#include "golden_dirs.h"

namespace lily {
namespace {

std::vector<std::string> backends() { return test_backends(); }

std::vector<int32_t> tokens_of(int seq, int from, int len, int V) {
  std::vector<int32_t> p;
  for (int i = from; i < from + len; ++i) p.push_back(int32_t((uint64_t(i + 97 * seq) * 2654435761u) % uint32_t(V)));
  return p;
}

int32_t argmax_of(const std::vector<float>& l) { return int32_t(std::max_element(l.begin(), l.end()) - l.begin()); }

// The second largest logit's gap to the largest.
double margin_of(const std::vector<float>& l) {
  const int32_t a = argmax_of(l);
  float second = -INFINITY;
  for (size_t i = 0; i < l.size(); ++i)
    if (int32_t(i) != a) second = std::max(second, l[i]);
  return double(l[size_t(a)]) - double(second);
}

struct Case {
  int context;    // tokens in the state before the step
  int feed;       // tokens the step feeds (1: a decode row)
  enum Out { kNone, kLogits, kGreedy, kTemp } out;
};

// A step's sequences: each case's state twice (the step's, `mixed`, and `alone`) filled to its context, the
// tokens it feeds, and its feed asking for its output (logits into got, or a draw into drawn).
struct StepSetup {
  std::vector<std::unique_ptr<SeqState>> mixed, alone;
  std::vector<std::vector<int32_t>> toks;
  std::vector<std::vector<float>> got;
  std::vector<DrawSpec> spec;
  std::vector<Drawn> drawn;
  std::vector<StepFeed> feeds;
};

void setup_step(Model& model, const std::vector<Case>& cases, int max_seq, StepSetup& x) {
  const int V = model.config().vocab_size;
  const size_t n = cases.size();
  for (size_t s = 0; s < n; ++s)
    for (auto* set : {&x.mixed, &x.alone}) {
      auto st = model.new_state(max_seq);
      ASSERT_TRUE(st.is_ok()) << st.message();
      if (cases[s].context > 0) {
        ASSERT_TRUE(model.forward(**st, tokens_of(int(s), 0, cases[s].context, V), {}).is_ok());
      }
      set->push_back(std::move(*st));
    }
  x.toks.resize(n), x.got.assign(n, std::vector<float>(size_t(V))), x.spec.resize(n), x.drawn.resize(n), x.feeds.resize(n);
  for (size_t s = 0; s < n; ++s) {
    x.toks[s] = tokens_of(int(s), cases[s].context, cases[s].feed, V);
    StepFeed& f = x.feeds[s];
    f.state = x.mixed[s].get(), f.tokens = x.toks[s];
    if (cases[s].out == Case::kLogits) f.logits = x.got[s].data();
    if (cases[s].out == Case::kGreedy) x.spec[s].top_logprobs = 3;
    if (cases[s].out == Case::kTemp) x.spec[s].inv_t = 1.25f, x.spec[s].u = 0.37 + 0.05 * double(s), x.spec[s].top_logprobs = 0;
    if (cases[s].out >= Case::kGreedy) f.draw = &x.spec[s], f.drawn = &x.drawn[s];
  }
}

void run_cases(Model& model, const std::string& backend, const std::vector<Case>& cases, double atol, double rtol) {
  const int V = model.config().vocab_size;
  const size_t n = cases.size();
  StepSetup x;
  setup_step(model, cases, 512, x);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  auto &mixed = x.mixed, &alone = x.alone;
  auto& toks = x.toks;
  auto& got = x.got;
  auto& spec = x.spec;
  auto& drawn = x.drawn;
  ASSERT_TRUE(model.step(x.feeds).is_ok());
  double max_err = 0;
  std::vector<int32_t> next(n);
  std::vector<float> ref(static_cast<size_t>(V));
  std::vector<float> w;
  std::vector<double> sums;
  for (size_t s = 0; s < n; ++s) {
    SCOPED_TRACE(fmt::format("seq {} (context {}, feed {})", s, cases[s].context, cases[s].feed));
    ASSERT_TRUE(model.forward(*alone[s], toks[s], ref).is_ok());
    EXPECT_EQ(mixed[s]->n_tokens(), alone[s]->n_tokens());
    next[s] = argmax_of(ref);
    if (cases[s].out == Case::kLogits) {
      for (int v = 0; v < V; ++v) {
        const float a = ref[size_t(v)], b = got[s][size_t(v)];
        max_err = std::max(max_err, double(std::fabs(a - b)));
        ASSERT_NEAR(b, a, atol + rtol * std::fabs(a)) << "id " << v;
      }
      if (margin_of(ref) > 2 * (atol + rtol * std::fabs(ref[size_t(next[s])]))) {
        EXPECT_EQ(argmax_of(got[s]), next[s]);
      }
    } else if (cases[s].out >= Case::kGreedy) {
      Drawn want;
      draw_row(ref, spec[s], want, w, sums);
      EXPECT_NEAR(drawn[s].logprob, want.logprob, atol + rtol * std::fabs(want.logprob));
      if (drawn[s].id != want.id) {  // only where the alone logits put the draw within the tolerance of another id
        const double tol = atol + rtol * std::fabs(ref[size_t(want.id)]);
        EXPECT_LE(std::fabs(double(ref[size_t(want.id)]) - double(ref[size_t(drawn[s].id)])), 4 * tol)
            << "drew " << drawn[s].id << " where draw_row on the alone logits draws " << want.id;
      }
      if (cases[s].out == Case::kGreedy) {
        EXPECT_EQ(drawn[s].n_top, 3);
        if (drawn[s].n_top > 0) {
          EXPECT_EQ(drawn[s].top_id[0], drawn[s].id);
        }
      }
    }
  }
  // Every sequence decodes one token in a batched step, then one alone: the states must agree.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<float>> out(n, std::vector<float>(size_t(V)));
    if (round == 0) {
      std::vector<StepFeed> dec(n);
      for (size_t s = 0; s < n; ++s) dec[s].state = mixed[s].get(), dec[s].tokens = {&next[s], 1}, dec[s].logits = out[s].data();
      ASSERT_TRUE(model.step(dec).is_ok());
    } else {
      for (size_t s = 0; s < n; ++s) ASSERT_TRUE(model.forward(*mixed[s], {&next[s], 1}, out[s]).is_ok());
    }
    for (size_t s = 0; s < n; ++s) {
      SCOPED_TRACE(fmt::format("after the step, round {}, seq {}", round, s));
      ASSERT_TRUE(model.forward(*alone[s], {&next[s], 1}, ref).is_ok());
      for (int v = 0; v < V; ++v) {
        const float a = ref[size_t(v)], b = out[s][size_t(v)];
        max_err = std::max(max_err, double(std::fabs(a - b)));
        ASSERT_NEAR(b, a, atol + rtol * std::fabs(a)) << "id " << v;
      }
      next[s] = argmax_of(ref);
    }
  }
  fmt::print("[model-step] {}: {} feeds, max |step - alone| logit {:.2e}\n", backend, n, max_err);
}

TEST(ModelStep, SegmentsAndDecodeRowsEqualForwardAlone) {
  const std::string dir = first_golden();
  if (dir.empty()) GTEST_SKIP() << "no checkpoints under tests/data/golden";
  each_backend(backends(), [&](Model& model, const std::string& backend) {
    ASSERT_TRUE(model.prepare(8, 256).is_ok());
    const bool loose = backend == "cuda";
    const double atol = loose ? 2e-3 : 1e-5, rtol = loose ? 2e-3 : 1e-6;
    // Decode rows beside segments: fresh and filled states, segments across the 64-token chunk edges
    // of the prefill kernels, every kind of output.
    run_cases(model, backend,
              {{0, 64, Case::kLogits}, {0, 7, Case::kNone}, {5, 1, Case::kGreedy}, {40, 1, Case::kTemp},
               {1, 65, Case::kGreedy}, {130, 1, Case::kLogits}, {63, 2, Case::kLogits}, {17, 130, Case::kTemp}},
              atol, rtol);
    // Segments only (no decode row), one of them a single token.
    run_cases(model, backend, {{0, 33, Case::kLogits}, {200, 129, Case::kLogits}, {3, 1, Case::kLogits}}, atol, rtol);
  });
}

// Long prompt segments (1,024 tokens and more: on CUDA single pass, run before the step's other rows and
// several in one prefill pass, cuda/step/prefill.cu) give each sequence exactly what forward() alone gives:
// the logits and draws of their last tokens, and (one more token each, alone) the states they leave. Beside
// them a decode row, within the step's tolerance as above. Sequences at different positions, with segment
// lengths across the 64-token chunk and 128-token tile edges.
TEST(ModelStep, LongSegmentsEqualForwardAlone) {
  const std::string dir = first_golden();
  if (dir.empty()) GTEST_SKIP() << "no checkpoints under tests/data/golden";
  each_backend(backends(), [&](Model& model, const std::string& backend) {
    ASSERT_TRUE(model.prepare(8, 256).is_ok());
    const int V = model.config().vocab_size;
    const std::vector<Case> cases = {{0, 1100, Case::kLogits}, {300, 1024, Case::kGreedy}, {37, 1153, Case::kLogits},
                                     {0, 1030, Case::kTemp},   {64, 1, Case::kLogits}};
    const size_t n = cases.size();
    StepSetup x;
    setup_step(model, cases, 2048, x);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    auto &mixed = x.mixed, &alone = x.alone;
    ASSERT_TRUE(model.step(x.feeds).is_ok());
    std::vector<float> ref(static_cast<size_t>(V)), w;
    std::vector<double> sums;
    const double row_tol = backend == "cuda" ? 2e-3 : 1e-5;  // the decode row: the batched step's tolerance
    for (size_t s = 0; s < n; ++s) {
      SCOPED_TRACE(fmt::format("seq {} (context {}, feed {})", s, cases[s].context, cases[s].feed));
      ASSERT_TRUE(model.forward(*alone[s], x.toks[s], ref).is_ok());
      EXPECT_EQ(mixed[s]->n_tokens(), alone[s]->n_tokens());
      const double tol = cases[s].feed == 1 ? row_tol : 0.0;
      if (cases[s].out == Case::kLogits) {
        for (int v = 0; v < V; ++v) ASSERT_NEAR(x.got[s][size_t(v)], ref[size_t(v)], tol + tol * std::fabs(ref[size_t(v)])) << "id " << v;
      } else {
        Drawn want;
        draw_row(ref, x.spec[s], want, w, sums);
        EXPECT_EQ(x.drawn[s].id, want.id);
        EXPECT_EQ(x.drawn[s].logprob, want.logprob);
        EXPECT_EQ(x.drawn[s].n_top, want.n_top);
      }
    }
    // One more token each, alone on both: the long segments' states (caches, windows, DeltaNet states, the
    // decode graph's position) equal alone's exactly.
    std::vector<float> a(static_cast<size_t>(V)), b(static_cast<size_t>(V));
    for (size_t s = 0; s < n; ++s) {
      if (cases[s].feed == 1) continue;
      SCOPED_TRACE(fmt::format("next token, seq {}", s));
      const int32_t t = int32_t((s * 7919 + 11) % size_t(V));
      ASSERT_TRUE(model.forward(*mixed[s], {&t, 1}, a).is_ok());
      ASSERT_TRUE(model.forward(*alone[s], {&t, 1}, b).is_ok());
      for (int v = 0; v < V; ++v) ASSERT_EQ(a[size_t(v)], b[size_t(v)]) << "id " << v;
    }
  });
}

TEST(ModelStep, RefusesBadFeeds) {
  const std::string dir = first_golden();
  if (dir.empty()) GTEST_SKIP() << "no checkpoints under tests/data/golden";
  auto m = load_quiet(dir);
  ASSERT_TRUE(m);
  Model& model = *m;
  const int V = model.config().vocab_size;
  auto a = model.new_state(8);
  ASSERT_TRUE(a.is_ok());
  const int32_t toks[3] = {1, 2, V};
  StepFeed f[2];
  f[0].state = a->get(), f[0].tokens = {toks, 2};
  f[1] = f[0];
  auto st = model.step(f);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("share one state"), std::string::npos) << st.message();
  f[0].tokens = {toks, 3};
  st = model.step({f, 1});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("vocabulary"), std::string::npos) << st.message();
  f[0].tokens = {toks, 2};
  DrawSpec bad;
  bad.u = 1.5;
  Drawn d;
  f[0].draw = &bad, f[0].drawn = &d;
  st = model.step({f, 1});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("draw spec"), std::string::npos) << st.message();
  f[0].draw = nullptr;
  std::vector<int32_t> nine(9, 1);  // more than max_seq
  f[0].tokens = nine;
  st = model.step({f, 1});
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ((*a)->n_tokens(), 0) << "a refused step changed the state";
}

}  // namespace
}  // namespace lily
