// Prefix cache selection: strict prefixes only, the request's key first, then the longest;
// least-recently-used eviction within the count limit.
#include <gtest/gtest.h>

#include "engine/prefix_cache.h"

namespace lily {
namespace {

class FakeState : public SeqState {
 public:
  explicit FakeState(size_t bytes) : bytes_(bytes) {}
  int n_tokens() const override { return 0; }
  int max_seq() const override { return 0; }
  size_t bytes() const override { return bytes_; }
  std::unique_ptr<SeqState> clone() const override { return std::make_unique<FakeState>(bytes_); }
  void reset() override {}

 private:
  size_t bytes_;
};

CacheEntry entry(std::vector<int32_t> toks, std::string key = "") {
  CacheEntry e;
  e.tokens = std::move(toks);
  e.state = std::make_unique<FakeState>(100);
  e.key = std::move(key);
  return e;
}

TEST(PrefixCache, StrictPrefixKeyThenLongest) {
  PrefixCache c(8, 1 << 20);
  c.put(entry({1, 2}));
  c.put(entry({1, 2, 3}));
  c.put(entry({1, 2, 3, 4}));   // equal to the prompt: not strict, never chosen
  c.put(entry({1, 9}, "k"));    // keyed but not a prefix
  EXPECT_FALSE(c.take({5, 6}, ""));
  auto e = c.take({1, 2, 3, 4}, "");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->tokens, (std::vector<int32_t>{1, 2, 3}));
  c.put(entry({1}, "k"));
  e = c.take({1, 2, 3, 4}, "k");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->tokens, (std::vector<int32_t>{1}));  // the key beats length
}

TEST(PrefixCache, EvictsLeastRecentlyUsed) {
  PrefixCache c(2, 1 << 20);
  EXPECT_TRUE(c.put(entry({1, 1})).empty());
  EXPECT_TRUE(c.put(entry({2, 2})).empty());
  auto evicted = c.put(entry({3, 3}));  // evicts {1,1}: its state comes back for reuse
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_NE(evicted[0], nullptr);
  EXPECT_EQ(c.size(), 2);
  EXPECT_EQ(c.put(entry({3, 3})).size(), 1u);  // the same tokens again: the old entry's state comes back
  EXPECT_FALSE(c.take({1, 1, 5}, ""));
  EXPECT_TRUE(c.take({2, 2, 5}, ""));
  PrefixCache small(8, 250);  // budget for two 100-byte states
  small.put(entry({1}));
  small.put(entry({2}));
  EXPECT_FALSE(small.fits(100));
  small.put(entry({3}));
  EXPECT_EQ(small.size(), 2);
  auto lru = small.take_lru();
  ASSERT_TRUE(lru);
  EXPECT_EQ(lru->tokens, (std::vector<int32_t>{2}));
}

TEST(PrefixCache, SharedEntryIsCopiedAndSameTokensReplace) {
  PrefixCache c(8, 1 << 20);
  CacheEntry head = entry({1, 2, 3});
  head.shared = true;
  SeqState* original = head.state.get();
  c.put(std::move(head));
  for (int i = 0; i < 3; ++i) {  // every prompt starting with the head gets its own copy
    auto e = c.take({1, 2, 3, 10 + i}, "");
    ASSERT_TRUE(e);
    EXPECT_EQ(e->tokens, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_NE(e->state.get(), original);
    EXPECT_FALSE(e->shared);
    EXPECT_EQ(c.size(), 1);
  }
  EXPECT_TRUE(c.holds({1, 2, 3}));
  EXPECT_FALSE(c.holds({1, 2}));
  // A longer, ordinary entry is moved out as before; the shared head stays.
  c.put(entry({1, 2, 3, 4, 5}));
  auto e = c.take({1, 2, 3, 4, 5, 6}, "");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->tokens.size(), 5u);
  EXPECT_EQ(c.size(), 1);
  // Storing the same tokens again replaces the entry instead of adding a second one.
  c.put(entry({1, 2, 3}));
  c.put(entry({1, 2, 3}));
  EXPECT_EQ(c.size(), 1);
  e = c.take({1, 2, 3, 9}, "");
  ASSERT_TRUE(e);
  EXPECT_EQ(c.size(), 0);  // the replacement was not shared: moved out
}

}  // namespace
}  // namespace lily
