// NgramLookup (prompt lookup's drafts) against a brute-force search of the same definition, on random
// histories over small alphabets (so n-grams recur), extended token by token as a reply grows and
// started over; plus the cases its contract names.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "engine/ngram_lookup.h"

namespace lily {
namespace {

// The definition, searched directly: for n = max_ngram down to 2, the latest e <= |fed| whose n tokens
// before it equal the last n of H = fed ++ [next]; then H[e..] continued by the draft itself.
std::vector<int32_t> brute(const std::vector<int32_t>& fed, int32_t next, int max_len, int max_ngram) {
  std::vector<int32_t> H = fed;
  H.push_back(next);
  const size_t L = H.size();
  for (int n = std::min<int>(max_ngram, int(L) - 1); n >= 2; --n)
    for (size_t e = fed.size(); e >= size_t(n); --e) {
      bool same = true;
      for (int i = 0; i < n && same; ++i) same = H[e - size_t(n) + size_t(i)] == H[L - size_t(n) + size_t(i)];
      if (!same) continue;
      std::vector<int32_t> out;
      for (size_t i = e; out.size() < size_t(max_len); ++i) out.push_back(i < L ? H[i] : out[i - L]);
      return out;
    }
  return {};
}

TEST(NgramLookup, MatchesBruteForceAsTheHistoryGrows) {
  std::mt19937 rng(11);
  int found = 0, calls = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int alphabet = 2 + trial % 7, max_ngram = 2 + trial % 4, max_len = 1 + trial % 6;
    std::uniform_int_distribution<int32_t> tok(0, alphabet - 1);
    std::vector<int32_t> fed;
    for (int i = 0; i < 5 + trial % 13; ++i) fed.push_back(tok(rng));
    NgramLookup lk;
    for (int step = 0; step < 80; ++step) {
      const int32_t next = tok(rng);
      const auto got = lk.draft(fed, next, max_len, max_ngram), want = brute(fed, next, max_len, max_ngram);
      ASSERT_EQ(got, want) << "trial " << trial << ", step " << step;
      found += !want.empty(), ++calls;
      // Feed next and, now and then, one to three more (a verify step's accepted drafts).
      fed.push_back(next);
      for (int extra = step % 4 == 0 ? 1 + step % 3 : 0; extra > 0; --extra) fed.push_back(tok(rng));
    }
    // A shorter history (a different sequence) starts the index over.
    fed.resize(fed.size() / 3);
    const int32_t next = tok(rng);
    ASSERT_EQ(lk.draft(fed, next, max_len, max_ngram), brute(fed, next, max_len, max_ngram)) << "trial " << trial;
  }
  EXPECT_GT(found, calls / 4) << "too few matches to test the lookup";
  EXPECT_LT(found, calls) << "every lookup matched: the no-match path is untested";
}

TEST(NgramLookup, ContractCases) {
  NgramLookup a;
  // No earlier occurrence of the last two tokens.
  EXPECT_TRUE(a.draft({{1, 2, 3, 4}}, 5, 4, 3).empty());
  // "1 2 3 4 1" + 2: the bigram "1 2" occurred at the start; what followed is 3 4 1 2, then itself.
  NgramLookup b;
  EXPECT_EQ(b.draft({{1, 2, 3, 4, 1}}, 2, 6, 3), (std::vector<int32_t>{3, 4, 1, 2, 3, 4}));
  // The longest n-gram wins over a later shorter one: "7 1 2" -> 8 earlier, "9 1 2" -> 5 later.
  NgramLookup c;
  EXPECT_EQ(c.draft({{7, 1, 2, 8, 9, 1, 2, 5, 7, 1}}, 2, 1, 3), (std::vector<int32_t>{8}));
  // For the same n, the latest occurrence: "1 2" -> 3, later "1 2" -> 4.
  NgramLookup d;
  EXPECT_EQ(d.draft({{1, 2, 3, 1, 2, 4, 1}}, 2, 1, 2), (std::vector<int32_t>{4}));
  // A repeated token repeats; max_len bounds the draft; max_ngram < 2 or max_len 0: none.
  NgramLookup e;
  EXPECT_EQ(e.draft({{6, 6, 6}}, 6, 5, 3), (std::vector<int32_t>(5, 6)));
  EXPECT_TRUE(e.draft({{6, 6, 6}}, 6, 0, 3).empty());
  EXPECT_TRUE(e.draft({{6, 6, 6}}, 6, 4, 1).empty());
}

}  // namespace
}  // namespace lily
