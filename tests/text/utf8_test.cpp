// UTF-8 repair and NFC quick-check tests. The maximal-subpart expectations are the Unicode
// Standard's own examples (chapter 3, "U+FFFD Substitution of Maximal Subparts").
#include "text/utf8.h"

#include <random>

#include <gtest/gtest.h>
#include <utf8proc.h>

#include "text/unicode.h"

namespace lily {
namespace {

const std::string R = "\xEF\xBF\xBD";

TEST(Utf8, LossyReplacesMaximalSubparts) {
  // Unicode Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64
  EXPECT_EQ(utf8::to_valid_lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"),
            "a" + R + R + R + "b" + R + "c" + R + R + "d");
  // Table 3-9..3-11 style: each byte of an ill-formed lead or surrogate sequence separately.
  EXPECT_EQ(utf8::to_valid_lossy("\xC0\xAF"), R + R);
  EXPECT_EQ(utf8::to_valid_lossy("\xED\xA0\x80"), R + R + R);
  EXPECT_EQ(utf8::to_valid_lossy("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(utf8::to_valid_lossy("\xE2\x82"), R);  // truncated at the end: one subpart
  EXPECT_EQ(utf8::to_valid_lossy("ok \xE2\x82\xAC"), "ok \xE2\x82\xAC");
}

TEST(Utf8, StablePrefixHoldsBackOnlyAnIncompleteTail) {
  EXPECT_EQ(utf8::stable_prefix_len("ab\xE2\x82"), 2u);
  EXPECT_EQ(utf8::stable_prefix_len("ab\xF0"), 2u);
  EXPECT_EQ(utf8::stable_prefix_len("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8::stable_prefix_len("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(utf8::stable_prefix_len("ab\x80"), 3u);      // a lone continuation byte is final
  EXPECT_EQ(utf8::stable_prefix_len("ab\xE2\x28"), 4u);  // already invalid: final
  EXPECT_EQ(utf8::stable_prefix_len("\xF0\x80"), 2u);    // F0 80 can never complete
  EXPECT_EQ(utf8::stable_prefix_len(""), 0u);
}

std::string utf8proc_nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &out,
                        utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::string r = n >= 0 ? std::string(reinterpret_cast<char*>(out), size_t(n)) : s;
  std::free(out);
  return r;
}

// The quick check may only say "already NFC" when utf8proc agrees, including for strings
// that mix inert code points with marks, jamo and other composition partners.
TEST(Unicode, NfcQuickCheckNeverSkipsNeededWork) {
  std::mt19937 rng(42);
  std::vector<uint32_t> inert;
  for (uint32_t cp = 0x20; cp < 0x30000; ++cp) {
    if (cp >= 0xD800 && cp < 0xE000) continue;
    std::string s;
    utf8::append_cp(cp, s);
    if (unicode::nfc_quick_check(s)) inert.push_back(cp);
  }
  ASSERT_GT(inert.size(), 100000u);
  const uint32_t partners[] = {0x301, 0x327, 0x1161, 0x11A8, 0x3099, 0x93C, 0x9BE, 0xBBE, 0xCD5, 0xDCA, 0x338};
  for (uint32_t cp : inert) {
    std::string one;
    utf8::append_cp(cp, one);
    ASSERT_EQ(utf8proc_nfc(one), one) << std::hex << cp;
    for (uint32_t p : partners) {  // inert code points never combine with what precedes them
      std::string before, tail;
      utf8::append_cp(p, before);
      before = "a" + before;
      EXPECT_EQ(utf8proc_nfc(before + one), utf8proc_nfc(before) + utf8proc_nfc(one)) << std::hex << cp;
    }
  }
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s;
    for (int k = 0, n = 1 + int(rng() % 12); k < n; ++k) utf8::append_cp(inert[rng() % inert.size()], s);
    ASSERT_TRUE(unicode::nfc_quick_check(s));
    ASSERT_EQ(utf8proc_nfc(s), s);
  }
}

TEST(Unicode, NfcMatchesUtf8procOnMixedText) {
  std::mt19937 rng(7);
  const uint32_t pool[] = {'a', 'e', 'n', ' ', 0x301, 0x303, 0x316, 0x334, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x212B,
                           0x2126, 0x915, 0x93C, 0x9C7, 0x9BE, 0x304B, 0x3099, 0x4E2D, 0x1F600, 0x1E9B, 0x323};
  for (int trial = 0; trial < 20000; ++trial) {
    std::string s;
    for (int k = 0, n = 1 + int(rng() % 16); k < n; ++k) utf8::append_cp(pool[rng() % std::size(pool)], s);
    ASSERT_EQ(unicode::nfc(s), utf8proc_nfc(s));
  }
}

}  // namespace
}  // namespace lily
