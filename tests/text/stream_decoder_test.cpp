// StreamDecoder must give exactly Tokenizer::decode of the whole sequence, emit nothing but
// complete characters, and hold back a character until its last byte arrives.
#include "text/stream_decoder.h"

#include <random>

#include <gtest/gtest.h>

#include "tok_test_util.h"
#include "text/unicode.h"
#include "text/utf8.h"

namespace lily {
namespace {

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip,
                       std::vector<std::string>* pieces = nullptr) {
  StreamDecoder sd(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string p = sd.push(id);
    if (pieces) pieces->push_back(p);
    out += p;
  }
  std::string f = sd.flush();
  if (pieces) pieces->push_back(f);
  return out + f;
}

const char* kTexts[] = {
    "天气预报说明天会下雨，所以我们决定把野餐改到下个星期六。",
    "東京都の人口は約1,400万人です。ｶﾞｷﾞｸﾞ 한국어를 공부하고 있어요.",
    "👨‍👩‍👧‍👦 family, 👩🏽‍🚀 astronaut, 🏳️‍🌈 flag, 🏴󠁧󠁢󠁥󠁮󠁧󠁿 England, 1️⃣ keycap, 🫱🏼‍🫲🏿",
    "بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ — नमस्ते! क्षत्रिय ज्ञान",
    "<|im_start|>user\n你好 😀<|im_end|>\n<|im_start|>assistant\n<think>\n🤔</think>\n\n<tool_call>{}</tool_call>",
    "Zalgo: ẑ̶̛̥a̷̡͎l̴̨̜g̵̢̛o̶̧͝ and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚 \U0010FFFF \uFFFD",
};

TEST(StreamDecoder, SameTextAsWholeDecodeForRealText) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  for (const char* text : kTexts) {
    std::vector<int32_t> ids = tok->encode(text);
    for (bool skip : {false, true}) {
      std::vector<std::string> pieces;
      EXPECT_EQ(stream_all(*tok, ids, skip, &pieces), tok->decode(ids, skip)) << text;
      for (const auto& p : pieces) EXPECT_TRUE(utf8::is_valid(p));
      if (!skip) {
        EXPECT_EQ(tok->decode(ids, false), unicode::nfc(text));  // round trip up to NFC
      }
    }
  }
}

// Byte-by-byte: one single-byte token per byte of the text, so a split falls at every byte.
// After each byte, the output so far must be exactly the text up to the last complete character.
TEST(StreamDecoder, EmitsEachCharacterWhenItsLastByteArrives) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  for (const char* text_c : kTexts) {
    std::string text = text_c;
    std::vector<int32_t> ids;
    for (unsigned char b : text) {
      auto id = tok->token_to_id(test::byte_char(b));
      ASSERT_TRUE(id.has_value());
      ids.push_back(*id);
    }
    StreamDecoder sd(*tok, false);
    std::string out;
    for (size_t k = 0; k < text.size(); ++k) {
      out += sd.push(ids[k]);
      size_t boundary = k + 1;  // longest prefix of text[0..k] that ends on a character boundary
      while (boundary < text.size() && (static_cast<unsigned char>(text[boundary]) & 0xC0) == 0x80) --boundary;
      ASSERT_EQ(out, text.substr(0, boundary)) << "after byte " << k << " of " << text;
    }
    EXPECT_EQ(sd.flush(), "");
  }
}

// Every split of the token sequence into two streams of pushes (reset in between is not
// allowed, so instead: every prefix length), compared with decoding that prefix whole.
TEST(StreamDecoder, EveryPrefixMatchesWholeDecodeOfThatPrefix) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  for (const char* text : kTexts) {
    std::vector<int32_t> ids = tok->encode(text);
    for (size_t cut = 0; cut <= ids.size(); ++cut) {
      std::vector<int32_t> prefix(ids.begin(), ids.begin() + cut);
      EXPECT_EQ(stream_all(*tok, prefix, false), tok->decode(prefix, false)) << text << " cut " << cut;
    }
  }
}

// Random ids, many single bytes (lone lead and continuation bytes), special and unknown ids:
// the lossy repair must come out the same streamed and whole.
TEST(StreamDecoder, RandomIdsIncludingInvalidUtf8) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  std::mt19937 rng(1234);
  int32_t n_vocab = tok->vocab_size();
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<int32_t> ids(1 + rng() % 24);
    for (auto& id : ids) {
      unsigned u = rng() % 100;
      if (u < 45) id = *tok->token_to_id(test::byte_char(128 + rng() % 128));
      else if (u < 55) id = n_vocab - 1 - int32_t(rng() % 30);
      else if (u < 58) id = n_vocab + int32_t(rng() % 100);  // unknown: skipped
      else id = int32_t(rng() % n_vocab);
    }
    for (bool skip : {false, true}) ASSERT_EQ(stream_all(*tok, ids, skip), tok->decode(ids, skip)) << "trial " << trial;
  }
}

TEST(StreamDecoder, FlushReplacesATruncatedCharacter) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  StreamDecoder sd(*tok, false);
  EXPECT_EQ(sd.push(*tok->token_to_id(test::byte_char(0xE4))), "");
  EXPECT_EQ(sd.push(*tok->token_to_id(test::byte_char(0xB8))), "");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(sd.flush(), "");
}

TEST(StreamDecoder, SpecialTokensShownOrSkipped) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  auto im_end = tok->token_to_id("<|im_end|>");
  auto think = tok->token_to_id("<think>");
  ASSERT_TRUE(im_end && think);
  StreamDecoder show(*tok, false), skip(*tok, true);
  EXPECT_EQ(show.push(*im_end), "<|im_end|>");
  EXPECT_EQ(skip.push(*im_end), "");
  EXPECT_EQ(skip.push(*think), "<think>");  // <think> is an added token but not special
}

}  // namespace
}  // namespace lily
