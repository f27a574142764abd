// The scheduler's prefill cost model: a fixed cost per forward plus a cost per token, fitted by
// least squares over recent forwards, answers how many tokens fit in a time budget.
#include <gtest/gtest.h>

#include "engine/prefill_cost.h"

namespace lily {
namespace {

TEST(PrefillCost, FitsFixedAndPerTokenCost) {
  PrefillCost c;
  EXPECT_FALSE(c.known());
  EXPECT_EQ(c.tokens_within(1.0), 0u);
  // 15 ms per forward + 0.2 ms per token, with ±0.5 ms of alternating noise.
  const size_t ns[] = {2, 90, 36, 52, 74, 23, 6, 128, 64, 8};
  for (int i = 0; i < 10; ++i) c.add(ns[i], 0.015 + 0.0002 * double(ns[i]) + (i % 2 ? 5e-4 : -5e-4));
  EXPECT_NEAR(c.fixed(), 0.015, 1e-3);
  EXPECT_NEAR(c.per_token(), 0.0002, 2e-5);
  EXPECT_NEAR(double(c.tokens_within(0.035)), 100.0, 12.0);
  EXPECT_EQ(c.tokens_within(0.010), 0u);  // below the fixed cost nothing fits
  EXPECT_NEAR(c.predict(100), 0.035, 1.5e-3);
}

TEST(PrefillCost, OneChunkSizeIsAllPerToken) {
  PrefillCost c;
  c.add(64, 0.032);
  c.add(64, 0.032);
  EXPECT_DOUBLE_EQ(c.fixed(), 0.0);
  EXPECT_DOUBLE_EQ(c.per_token(), 0.0005);
  EXPECT_EQ(c.tokens_within(0.016), 32u);
}

TEST(PrefillCost, RecentForwardsReplaceOldOnes) {
  PrefillCost c;
  for (int i = 0; i < 40; ++i) c.add(size_t(16 + i), 0.001 * double(16 + i));  // 1 ms per token
  for (int i = 0; i < 40; ++i) c.add(size_t(16 + i), 0.004 + 0.0001 * double(16 + i));  // a faster machine
  EXPECT_NEAR(c.fixed(), 0.004, 1e-9);
  EXPECT_NEAR(c.per_token(), 0.0001, 1e-12);
  c.add(0, 1.0);    // ignored
  c.add(10, -1.0);  // ignored
  EXPECT_NEAR(c.per_token(), 0.0001, 1e-12);
}

}  // namespace
}  // namespace lily
