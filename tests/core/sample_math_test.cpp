// The sampler's vectorized loops against their scalar definitions: argmax (first of ties, -inf
// rows, odd lengths), exp over [-87, 0] within 3e-7 relative of std::exp, and the one-pass top-k
// against a full sort with ties.
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

}  // namespace
}  // namespace lily
