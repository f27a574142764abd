// Sampler: greedy ties, seeded reproducibility, that each filter removes exactly what its
// definition says (checked against frequencies of many seeded draws), that the penalties are
// those of their definition, and that a backend drawing device_spec() with draw_row draws what
// sample() draws for every option mix.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>

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

// The request options the API takes, mixed; `mask` marks the mixes drawn under a token mask.
struct Mix {
  SamplingParams p;
  bool mask = false;
};
std::vector<Mix> option_mixes() {
  std::vector<Mix> m;
  auto add = [&](float t, int k, float top_p, float min_p, float pres, float freq, float rep, int lp, bool mask) {
    Mix x;
    x.p.temperature = t, x.p.top_k = k, x.p.top_p = top_p, x.p.min_p = min_p;
    x.p.presence_penalty = pres, x.p.frequency_penalty = freq, x.p.repetition_penalty = rep;
    x.p.top_logprobs = lp, x.mask = mask;
    m.push_back(x);
  };
  add(0.0f, 0, 1.0f, 0.0f, 0, 0, 1.0f, 3, false);       // greedy
  add(0.8f, 0, 1.0f, 0.0f, 0, 0, 1.0f, -1, false);      // plain draw
  add(0.7f, 20, 0.8f, 0.0f, 0, 0, 1.0f, 5, false);      // Qwen's recommended cuts
  add(1.0f, 40, 1.0f, 0.0f, 0, 0, 1.0f, -1, false);     // top-k
  add(1.3f, 0, 0.9f, 0.0f, 0, 0, 1.0f, 0, false);       // top-p
  add(0.6f, 0, 1.0f, 0.05f, 0, 0, 1.0f, 20, false);     // min-p
  add(0.9f, 50, 0.95f, 0.02f, 0.5f, 0.3f, 1.1f, 2, false);  // everything
  add(1.0f, 0, 1.0f, 0.0f, 1.5f, 0.0f, 1.0f, -1, false);    // presence
  add(0.0f, 0, 1.0f, 0.0f, 0.0f, 0.8f, 1.0f, 1, false);     // frequency, greedy
  add(0.8f, 0, 1.0f, 0.0f, 0.0f, 0.0f, 1.3f, -1, false);    // repetition (prompt too)
  add(1.0f, 1, 1.0f, 0.0f, 0.0f, -1.0f, 0.8f, 4, false);    // top_k 1 = greedy; negative frequency; rep < 1
  add(0.8f, 0, 1.0f, 0.0f, 0, 0, 1.0f, 3, true);        // masked plain draw
  add(0.7f, 20, 0.9f, 0.05f, 0.4f, 0.2f, 1.05f, 5, true);   // masked, cut and penalised
  add(0.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 1.2f, -1, true);     // masked greedy, penalised
  return m;
}

// Logits: random, near-tied (quarter steps: many exact ties), or nearly flat.
std::vector<float> test_logits(std::mt19937& g, int kind, size_t V) {
  std::vector<float> l(V);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::uniform_int_distribution<int> q(-6, 6);
  for (auto& v : l) v = kind == 0 ? nd(g) : kind == 1 ? float(q(g)) * 0.25f : 1.0f + nd(g) * 1e-3f;
  return l;
}

TEST(Sampler, DeviceSpecDrawsWhatSampleDraws) {
  // A backend drawing with device_spec() + draw_row must give the same ids, log-probabilities
  // and alternatives as sample() for the same seed, for every option mix, on random and
  // near-tied logits, over many seeds; and every such request is device-drawable.
  std::mt19937 g(11);
  const size_t V = 3000;
  const std::vector<int32_t> prompt = {5, 17, 17, 2999, 400, 5, 1234};
  int steps = 0;
  const std::vector<Mix> mixes = option_mixes();
  for (size_t mi = 0; mi < mixes.size(); ++mi)
    for (uint64_t seed : {1u, 2u, 99u, 12345u}) {
      const Mix& m = mixes[mi];
      SamplingParams p = m.p;
      p.seed = seed;
      Sampler host(p, prompt), dev(p, prompt);
      DrawScratch scratch;
      for (int step = 0; step < 30; ++step) {
        ASSERT_TRUE(dev.device_drawable());
        const std::vector<float> l = test_logits(g, step % 3, V);
        std::vector<uint64_t> mask;
        if (m.mask) {
          mask.assign((V + 63) / 64, 0);
          for (size_t i = 0; i < V; ++i)
            if (g() % 3 == 0 || i == 7) mask[i / 64] |= uint64_t(1) << (i % 64);
        }
        const SampleResult r = host.sample(l, mask);
        Drawn d;
        draw_row(l, dev.device_spec(mask), d, scratch);
        dev.accept(d.id);
        const std::string what = "mix " + std::to_string(mi) + " seed " + std::to_string(seed) + " step " +
                                 std::to_string(step);
        ASSERT_EQ(d.id, r.id) << what;
        if (m.mask) {
          ASSERT_TRUE(mask[size_t(d.id) / 64] >> (d.id % 64) & 1) << what;
        }
        ASSERT_EQ(r.logprob.has_value(), p.top_logprobs >= 0);
        if (r.logprob) {
          EXPECT_EQ(d.logprob, *r.logprob) << what;
          ASSERT_EQ(d.n_top, int(r.top.size())) << what;
          for (int i = 0; i < d.n_top; ++i) EXPECT_EQ(d.top_id[i], r.top[size_t(i)].id) << what;
        }
        ++steps;
      }
    }
  std::printf("device spec + draw_row == sample(): %d draws\n", steps);
}

TEST(Sampler, PenaltiesAsDefined) {
  // The penalties the sampler hands to draw_row are those of their definition, applied here to
  // the logits the old way (repetition over prompt + generated tokens, then presence + frequency ·
  // count over generated ones) before an unpenalised sampler with the same seed and cuts draws:
  // the same ids, step for step, greedy and drawn.
  std::mt19937 g(3);
  const size_t V = 500;
  const std::vector<int32_t> prompt = {1, 2, 3, 3, 499, 250, -4, 7000};
  int n = 0;
  for (const Mix& m : option_mixes()) {
    SamplingParams p = m.p;
    if (p.presence_penalty == 0 && p.frequency_penalty == 0 && p.repetition_penalty == 1.0f) continue;
    p.seed = 77;
    SamplingParams plain = p;
    plain.presence_penalty = plain.frequency_penalty = 0.0f, plain.repetition_penalty = 1.0f;
    Sampler s(p, prompt), ref(plain, prompt);
    std::map<int32_t, int> counts;
    std::set<int32_t> seen(prompt.begin(), prompt.end());
    for (int step = 0; step < 60; ++step) {
      std::vector<float> l = test_logits(g, step % 2, V);
      const SampleResult r = s.sample(l);
      for (int32_t t : seen)
        if (t >= 0 && t < int32_t(V) && p.repetition_penalty != 1.0f) {
          float& x = l[size_t(t)];
          x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
        }
      for (auto [t, c] : counts) l[size_t(t)] -= p.presence_penalty + p.frequency_penalty * float(c);
      const SampleResult want = ref.sample(l);
      ASSERT_EQ(r.id, want.id) << "step " << step << " presence " << p.presence_penalty << " frequency "
                               << p.frequency_penalty << " repetition " << p.repetition_penalty;
      counts[r.id]++, seen.insert(r.id);
      ++n;
    }
  }
  EXPECT_GT(n, 200);
}

TEST(Sampler, DeviceDrawableLimits) {
  for (const Mix& m : option_mixes()) EXPECT_TRUE(Sampler(m.p, {}).device_drawable());
  SamplingParams p;
  p.top_logprobs = kMaxDrawTop + 1;
  EXPECT_FALSE(Sampler(p, {}).device_drawable());
  // A penalty list longer than a spec carries: the host samples the request.
  p = {};
  p.repetition_penalty = 1.1f;
  std::vector<int32_t> prompt(kMaxDrawPenalties);
  std::iota(prompt.begin(), prompt.end(), 0);
  Sampler s(p, prompt);
  EXPECT_TRUE(s.device_drawable());
  s.accept(kMaxDrawPenalties - 1);  // already listed
  EXPECT_TRUE(s.device_drawable());
  s.accept(kMaxDrawPenalties);
  EXPECT_FALSE(s.device_drawable());
  // Penalised requests' specs depend on the previous token (no pipelining).
  EXPECT_TRUE(s.penalized());
  p = {};
  p.top_p = 0.5f, p.top_k = 3, p.min_p = 0.1f;
  EXPECT_FALSE(Sampler(p, {}).penalized());
  p.presence_penalty = 0.1f;
  EXPECT_TRUE(Sampler(p, {}).penalized());
}

TEST(Sampler, FilteredDrawFollowsItsDistribution) {
  // top_k 50, min_p 0.02, top_p 0.9 at T = 0.8 on 2000 random logits: frequencies of 30000 seeded
  // draws against the cut softmax computed here in double; nothing outside the cuts is drawn.
  std::mt19937 g(21);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> l(2000);
  for (auto& v : l) v = nd(g);
  const double T = 0.8;
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  ids.resize(50);
  std::vector<double> w;
  for (int32_t i : ids) w.push_back(std::exp((double(l[size_t(i)]) - double(l[size_t(ids[0])])) / T));
  size_t n = 0;
  while (n < w.size() && w[n] >= 0.02) ++n;
  double total = std::accumulate(w.begin(), w.begin() + long(n), 0.0), cum = 0;
  size_t keep = 0;
  while (keep < n && (cum += w[keep++]) < 0.9 * total) {
  }
  ASSERT_GT(keep, 3u);
  SamplingParams p;
  p.temperature = float(T), p.top_k = 50, p.min_p = 0.02f, p.top_p = 0.9f;
  const int draws = 30000;
  auto h = histogram(p, l, draws);
  for (size_t j = 0; j < keep; ++j) {
    const double want = w[j] / cum;
    EXPECT_NEAR(h[ids[j]] / double(draws), want, 5 * std::sqrt(want * (1 - want) / draws) + 1e-3) << "rank " << j;
  }
  int outside = 0;
  for (auto& [id, c] : h)
    if (std::find(ids.begin(), ids.begin() + long(keep), id) == ids.begin() + long(keep)) outside += c;
  EXPECT_EQ(outside, 0);
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
