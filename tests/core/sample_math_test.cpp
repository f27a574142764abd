// The sampler's vectorized loops against their scalar definitions: argmax (first of ties, -inf
// rows, odd lengths), exp over [-87, 0] within 3e-7 relative of std::exp, and the one-pass top-k
// against a full sort with ties. The filtered draw's pieces: draw_key orders like (logit desc, id
// asc) with -0 = +0, the 128-bit helpers against schoolbook arithmetic, and draw_filtered against
// its definition written out plainly (float comparisons, stable sort, step by step) over random,
// near-tied and flat rows, every cut mix and u at the ends of [0, 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "core/sample_math.h"

namespace lily {
namespace {

int32_t argmax_scalar(const std::vector<float>& x) {
  int32_t best = 0;
  for (size_t i = 1; i < x.size(); ++i)
    if (x[i] > x[size_t(best)]) best = int32_t(i);
  return best;
}

TEST(SampleMath, ArgmaxMatchesScalarWithTies) {
  std::mt19937 g(3);
  for (size_t n : {1u, 2u, 7u, 8u, 9u, 15u, 16u, 17u, 1000u, 248320u}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<float> x(n);
      std::uniform_int_distribution<int> small(-3, 3);  // many ties
      for (auto& v : x) v = rep % 2 ? float(small(g)) : std::normal_distribution<float>(0, 5)(g);
      if (rep == 3) std::fill(x.begin(), x.end(), -std::numeric_limits<float>::infinity());
      if (rep == 4) x.back() = 1e30f;
      ASSERT_EQ(argmax_fast(x), argmax_scalar(x)) << "n " << n << " rep " << rep;
    }
  }
  EXPECT_EQ(argmax_fast(std::span<const float>()), 0);
}

TEST(SampleMath, ExpWithinTolerance) {
  std::vector<float> z, out;
  for (float v = -87.0f; v <= 0.0f; v += 0.0137f) z.push_back(v);
  z.push_back(0.0f);
  z.push_back(-1e-30f);
  out.resize(z.size());
  exp_nonpositive(z.data(), out.data(), z.size());
  double worst = 0;
  for (size_t i = 0; i < z.size(); ++i) {
    const double ref = std::exp(double(z[i]));
    worst = std::max(worst, std::abs(out[i] - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7) << "max relative error";
  // Odd tail lengths, and inputs outside the range clamp rather than produce garbage.
  std::vector<float> t{-100.0f, 5.0f, -0.5f}, o(3);
  exp_nonpositive(t.data(), o.data(), 3);
  EXPECT_LT(o[0], 1e-37f);
  EXPECT_FLOAT_EQ(o[1], 1.0f);
  EXPECT_NEAR(o[2], std::exp(-0.5), 1e-7);
}

TEST(SampleMath, TopKMatchesSort) {
  std::mt19937 g(5);
  for (size_t n : {1u, 5u, 20u, 21u, 1000u, 100000u}) {
    for (int k : {0, 1, 2, 5, 20}) {
      std::vector<float> x(n);
      std::uniform_int_distribution<int> small(0, 9);
      for (auto& v : x) v = float(small(g));
      std::vector<int32_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
      idx.resize(std::min<size_t>(n, size_t(k)));
      EXPECT_EQ(top_k_ids(x, k), idx) << "n " << n << " k " << k;
    }
  }
}

bool before(const std::vector<float>& l, int32_t a, int32_t b) {
  return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b);
}

TEST(SampleMath, DrawKeyOrdersByLogitThenId) {
  std::mt19937 g(8);
  std::uniform_int_distribution<int> small(-4, 4);
  std::vector<float> l(3000);
  for (size_t i = 0; i < l.size(); ++i) {
    const int v = small(g);
    l[i] = i % 7 == 0 ? (i % 14 == 0 ? -0.0f : 0.0f) : i % 3 ? float(v) * 0.5f : std::normal_distribution<float>(0, 30)(g);
  }
  l[5] = -std::numeric_limits<float>::max(), l[6] = std::numeric_limits<float>::max(), l[9] = 1e-40f, l[10] = -1e-40f;
  std::vector<int32_t> by_cmp(l.size()), by_key(l.size());
  std::iota(by_cmp.begin(), by_cmp.end(), 0);
  std::iota(by_key.begin(), by_key.end(), 0);
  std::sort(by_cmp.begin(), by_cmp.end(), [&](int32_t a, int32_t b) { return before(l, a, b); });
  std::sort(by_key.begin(), by_key.end(),
            [&](int32_t a, int32_t b) { return draw_key(l[size_t(a)], a) > draw_key(l[size_t(b)], b); });
  EXPECT_EQ(by_key, by_cmp);
  for (int32_t i : {0, 1, 77, 248319, (1 << 24) - 1}) EXPECT_EQ(draw_key_id(draw_key(1.5f, i)), i);
}

// a·b >> s for a < 2^64 and b < 2^128, by 32-bit limbs.
DrawU128 mul_shift(uint64_t a, DrawU128 b, int s) {
  uint64_t x[2] = {a & 0xffffffffu, a >> 32}, y[4], r[7] = {};
  for (int i = 0; i < 4; ++i) y[i] = uint64_t(b >> (32 * i)) & 0xffffffffu;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      uint64_t carry = x[i] * y[j];
      for (int k = i + j; carry; ++k) {
        const uint64_t t = r[k] + (carry & 0xffffffffu);
        r[k] = t & 0xffffffffu;
        carry = (carry >> 32) + (t >> 32);
      }
    }
  DrawU128 out = 0;  // bits s .. s+127 of the 224-bit product
  for (int k = 0; k < 7; ++k) {
    const int at = 32 * k - s;
    if (at >= 128 || at <= -32) continue;
    out += at >= 0 ? DrawU128(r[k]) << at : DrawU128(r[k] >> -at);
  }
  return out;
}

TEST(SampleMath, DrawIntegerHelpers) {
  EXPECT_EQ(draw_fixed(1.0f), uint64_t(1) << 63);
  EXPECT_EQ(draw_fixed(0.5f), uint64_t(1) << 62);
  EXPECT_EQ(draw_fixed(0x1p-40f), uint64_t(1) << 23);
  EXPECT_EQ(draw_fixed(0.0f), 0u);
  std::mt19937_64 g(4);
  const DrawU128 big = DrawU128(1) << 87;  // 2^24 ids of weight 1
  for (int rep = 0; rep < 20000; ++rep) {
    DrawU128 total = rep % 4 == 0 ? big - DrawU128(g() % 1000) : (DrawU128(g() >> (g() % 64)) << (g() % 24)) + 1;
    if (total > big) total = big;
    const uint64_t m = rep % 5 == 0 ? (uint64_t(1) << 53) - 1 - g() % 3 : g() >> 11;
    const double u = double(m) * 0x1p-53;
    const DrawU128 want = mul_shift(m, total, 53);
    ASSERT_EQ(draw_walk_target(u, total), want) << rep;
    ASSERT_LT(want, total) << rep;
    const float top_p = rep % 7 == 0 ? 1.0f : float(g() % 1000000) * 1e-6f + 1e-7f;
    const uint64_t tp = uint64_t(double(top_p) * 0x1p32);
    DrawU128 need = mul_shift(tp, total, 32);
    if (mul_shift(tp, total, 0) % (DrawU128(1) << 32) != 0) ++need;  // the low 32 bits: round up
    if (need == 0) need = 1;
    ASSERT_EQ(draw_top_p_need(top_p, total), need) << rep;
    ASSERT_LE(need, total) << rep;
  }
}

// draw_filtered's definition, written out step by step with float comparisons (no keys).
int32_t filtered_reference(const std::vector<float>& l, float inv_t, const DrawCuts& c, double u) {
  const int32_t best = argmax_fast(l);
  std::vector<float> w(l.size());
  softmax_weights(l, l[size_t(best)], inv_t, -40.0f, w.data());
  std::vector<int32_t> ids;
  for (size_t i = 0; i < l.size(); ++i)
    if (w[i] > 0.0f) ids.push_back(int32_t(i));
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)]; });
  if (c.top_k > 0 && size_t(c.top_k) < ids.size()) ids.resize(size_t(c.top_k));
  if (c.min_p > 0.0f) std::erase_if(ids, [&](int32_t i) { return !(w[size_t(i)] >= c.min_p); });
  if (ids.empty()) return best;
  std::vector<DrawU128> cum;
  DrawU128 s = 0;
  for (int32_t i : ids) cum.push_back(s += draw_fixed(w[size_t(i)]));
  size_t n = ids.size();
  if (c.top_p < 1.0f) {
    const DrawU128 need = draw_top_p_need(c.top_p, cum.back());
    n = size_t(std::find_if(cum.begin(), cum.end(), [&](DrawU128 x) { return x >= need; }) - cum.begin()) + 1;
  }
  const DrawU128 target = draw_walk_target(u, cum[n - 1]);
  return ids[size_t(std::upper_bound(cum.begin(), cum.begin() + long(n), target) - cum.begin())];
}

TEST(SampleMath, FilteredDrawMatchesItsDefinition) {
  std::mt19937 g(12);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  std::vector<float> w;
  std::vector<uint64_t> keys;
  const DrawCuts mixes[] = {{40, 1.0f, 0.0f}, {0, 0.9f, 0.0f}, {0, 1.0f, 0.05f}, {20, 0.8f, 0.0f}, {50, 0.95f, 0.02f},
                            {1000000, 0.5f, 0.0f}, {3, 1.0f, 1.0f}, {0, 1e-6f, 0.0f}, {7, 0.99999f, 0.3f}};
  int checked = 0;
  for (int kind = 0; kind < 4; ++kind)
    for (size_t V : {1u, 3u, 64u, 1000u, 6000u}) {
      std::vector<float> l(V);
      std::normal_distribution<float> nd(0.f, 3.f);
      std::uniform_int_distribution<int> q(-8, 8);
      for (auto& v : l) v = kind == 0 ? nd(g) : kind == 1 ? float(q(g)) * 0.25f : kind == 2 ? 0.5f : nd(g) * 0.01f;
      for (const DrawCuts& c : mixes)
        for (float inv_t : {0.5f, 1.0f, 1.7f, 25.0f})
          for (int r = 0; r < 6; ++r) {
            const double u = r == 0 ? 0.0 : r == 1 ? 1.0 - 0x1.0p-53 : ud(g);
            const int32_t best = argmax_fast(l);
            ASSERT_EQ(draw_filtered(l, best, inv_t, c, u, w, keys), filtered_reference(l, inv_t, c, u))
                << "kind " << kind << " V " << V << " top_k " << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p
                << " inv_t " << inv_t << " u " << u;
            ++checked;
          }
    }
  EXPECT_GT(checked, 1000);
  // No candidate (an infinite best logit): the argmax.
  std::vector<float> inf{1.0f, std::numeric_limits<float>::infinity(), 2.0f};
  EXPECT_EQ(draw_filtered(inf, 1, 1.0f, {5, 0.9f, 0.0f}, 0.3, w, keys), 1);
}

}  // namespace
}  // namespace lily
