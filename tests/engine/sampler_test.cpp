// Sampler: greedy ties, seeded reproducibility, and that each filter removes exactly what its
// definition says (checked against frequencies of many seeded draws).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "engine/sampler.h"
#include "engine/stop_matcher.h"

namespace lily {
namespace {

std::map<int32_t, int> histogram(SamplingParams p, std::vector<float> logits, int n) {
  std::map<int32_t, int> h;
  p.seed = 7;
  Sampler s(p, {});
  for (int i = 0; i < n; ++i) {
    auto l = logits;
    h[s.sample(l).id]++;
  }
  return h;
}

TEST(Sampler, GreedyTiesGoToLowestId) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, {});
  std::vector<float> l{1, 3, 3, 2};
  EXPECT_EQ(s.sample(l).id, 1);
}

TEST(Sampler, SeededIsReproducible) {
  SamplingParams p;
  p.seed = 1234;
  std::vector<float> base(1000);
  for (int i = 0; i < 1000; ++i) base[i] = std::sin(i * 0.37f) * 3;
  std::vector<int32_t> a, b;
  for (auto* out : {&a, &b}) {
    Sampler s(p, {});
    for (int i = 0; i < 50; ++i) {
      auto l = base;
      out->push_back(s.sample(l).id);
    }
  }
  EXPECT_EQ(a, b);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 5u);  // it really samples
}

TEST(Sampler, UnfilteredDrawFollowsSoftmaxAcrossBlocks) {
  // 1000 ids (several 256-id blocks of the fast path): six likely ids spread over the blocks, the
  // rest flat and unlikely; frequencies of 20000 seeded draws at T = 0.7 against softmax(l / T)
  // computed here in double.
  std::vector<float> l(1000, -2.0f);
  const int heavy[6] = {0, 255, 256, 511, 700, 999};
  for (int i = 0; i < 6; ++i) l[size_t(heavy[i])] = 1.0f + 0.3f * float(i);
  SamplingParams p;
  p.temperature = 0.7f;
  const int n = 20000;
  auto h = histogram(p, l, n);
  double z = 0;
  for (float v : l) z += std::exp(double(v) / 0.7);
  double rest = 1.0;
  for (int id : heavy) {
    const double want = std::exp(double(l[size_t(id)]) / 0.7) / z;
    rest -= want;
    EXPECT_NEAR(h[id] / double(n), want, 4 * std::sqrt(want * (1 - want) / n) + 1e-3) << "id " << id;
  }
  int others = 0;
  for (auto& [id, c] : h)
    if (std::find(std::begin(heavy), std::end(heavy), id) == std::end(heavy)) others += c;
  EXPECT_NEAR(others / double(n), rest, 4 * std::sqrt(rest * (1 - rest) / n) + 1e-3);
}

TEST(Sampler, DeviceSpecDrawsWhatSampleDraws) {
  // A backend drawing with device_spec() + draw_row must give the same ids, log-probabilities
  // and alternatives as sample() for the same seed, greedy and at a temperature; requests with
  // penalties or cuts are not device-drawable.
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.f, 2.f);
  for (float temp : {0.0f, 0.8f, 1.3f}) {
    SamplingParams p;
    p.temperature = temp;
    p.seed = 99;
    p.top_logprobs = 3;
    Sampler host(p, {}), dev(p, {});
    ASSERT_TRUE(dev.device_drawable());
    std::vector<float> w;
    std::vector<double> sums;
    for (int step = 0; step < 40; ++step) {
      std::vector<float> l(5000);
      for (auto& v : l) v = nd(g);
      auto lh = l;
      const SampleResult r = host.sample(lh);
      Drawn d;
      draw_row(l, dev.device_spec(), d, w, sums);
      dev.accept(d.id);
      ASSERT_EQ(d.id, r.id) << "temp " << temp << " step " << step;
      ASSERT_TRUE(r.logprob);
      EXPECT_FLOAT_EQ(d.logprob, *r.logprob);
      ASSERT_EQ(d.n_top, int(r.top.size()));
      for (int i = 0; i < d.n_top; ++i) EXPECT_EQ(d.top_id[i], r.top[size_t(i)].id);
    }
  }
  for (auto tweak : {0, 1, 2, 3, 4}) {
    SamplingParams p;
    if (tweak == 0) p.top_p = 0.9f;
    if (tweak == 1) p.top_k = 40;
    if (tweak == 2) p.presence_penalty = 0.5f;
    if (tweak == 3) p.repetition_penalty = 1.1f;
    if (tweak == 4) p.top_logprobs = kMaxDrawTop + 1;
    EXPECT_FALSE(Sampler(p, {}).device_drawable()) << tweak;
  }
}

TEST(Sampler, TopKAndTopPAndMinP) {
  std::vector<float> l{std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  SamplingParams p;
  p.top_k = 2;
  auto h = histogram(p, l, 4000);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
  EXPECT_NEAR(h[0] / 4000.0, 0.5 / 0.8, 0.03);
  p = {};
  p.top_p = 0.7f;  // 0.5 < 0.7 <= 0.8: tokens 0 and 1
  h = histogram(p, l, 4000);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
  EXPECT_GT(h[1], 0);
  p = {};
  p.min_p = 0.2f;  // keeps p >= 0.1: tokens 0..2
  h = histogram(p, l, 4000);
  EXPECT_EQ(h.count(3), 0u);
  EXPECT_GT(h[2], 0);
}

TEST(Sampler, PenaltiesAndLogprobs) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 2.0f;
  p.top_logprobs = 2;
  Sampler s(p, {});
  std::vector<float> l{1.0f, 0.5f, 0.0f};
  auto r = s.sample(l);
  EXPECT_EQ(r.id, 0);
  ASSERT_TRUE(r.logprob);
  double z = std::log(std::exp(1.0) + std::exp(0.5) + 1.0);
  EXPECT_NEAR(*r.logprob, 1.0 - z, 1e-5);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[1].id, 1);
  std::vector<float> l2{1.0f, 0.5f, 0.0f};
  EXPECT_EQ(s.sample(l2).id, 1);  // token 0 now pays the presence penalty
}

TEST(StopMatcher, HoldsBackPartialMatches) {
  // Every split of the text must give the same output.
  std::string text = "abc STO STOP def";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    StopMatcher m({"STOP", "xyz"});
    auto a = m.push(text.substr(0, cut));
    std::string out = a.text;
    bool stopped = a.stopped;
    if (!stopped) {
      auto b = m.push(text.substr(cut));
      out += b.text;
      stopped = b.stopped;
    }
    EXPECT_TRUE(stopped) << cut;
    EXPECT_EQ(out, "abc STO ") << cut;
  }
  StopMatcher m({"xyz"});
  EXPECT_EQ(m.push("ab x").text, "ab ");
  EXPECT_EQ(m.flush(), "x");
}

}  // namespace
}  // namespace lily
