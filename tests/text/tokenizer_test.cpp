// Tokenizer behaviour on the real Qwen3 tokenizer.json that the oracle node test cannot see:
// thread safety of the shared pre-token cache, engine-facing lookups, and load errors.
#include "text/tokenizer.h"

#include <thread>

#include <gtest/gtest.h>

#include "tok_test_util.h"

namespace lily {
namespace {

TEST(QwenTokenizer, ConcurrentEncodeMatchesSerial) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back("doc " + std::to_string(i) + ": the quick brown fox 天气 👍🏽 <think>x</think> " +
                    std::string(size_t(i % 7), ' ') + std::to_string(i * 7919) + " it's");
  std::vector<std::vector<int32_t>> serial;
  for (const auto& t : texts) serial.push_back(tok->encode(t));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int w = 0; w < 4; ++w)
    threads.emplace_back([&, w] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (tok->encode(texts[(i + size_t(w) * 13) % texts.size()]) != serial[(i + size_t(w) * 13) % texts.size()]) ++bad[w];
    });
  for (auto& t : threads) t.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(bad[w], 0) << "worker " << w;
}

TEST(QwenTokenizer, EngineLookupsComeFromTheFiles) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  // Ids by text, as the engine asks for them; the values are whatever the file says.
  const auto& m = tok->markers();
  ASSERT_TRUE(m.think_open && m.think_close && m.tool_call_open && m.tool_call_close);
  EXPECT_EQ(tok->decode(std::vector<int32_t>{*m.think_open, *m.think_close}, false), "<think></think>");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{*m.tool_call_open, *m.tool_call_close}, false), "<tool_call></tool_call>");
  EXPECT_EQ(tok->encode("<think>"), std::vector<int32_t>{*m.think_open});
  // tokenizer_config.json of this package names <|im_end|> as eos.
  EXPECT_EQ(tok->eos_token(), "<|im_end|>");
  ASSERT_TRUE(tok->eos_id());
  EXPECT_EQ(tok->eos_id(), tok->token_to_id("<|im_end|>"));
  EXPECT_TRUE(tok->is_special(*tok->eos_id()));
  auto eot = *tok->token_to_id("<|endoftext|>");
  EXPECT_EQ(tok->stop_ids({eot, *tok->eos_id()}), (std::vector<int32_t>{*tok->eos_id(), eot}));
  EXPECT_GT(tok->vocab_size(), *m.think_close);
}

TEST(QwenTokenizer, NeverFailsOnArbitraryBytes) {
  LILY_NEED_QWEN_TOKENIZER(tok);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  for (int rep = 0; rep < 3; ++rep) all += all;
  auto ids = tok->encode(all);
  EXPECT_FALSE(ids.empty());
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(QwenTokenizer, LoadErrorsAreValues) {
  auto r = Tokenizer::load("/nonexistent/tokenizer.json", "");
  EXPECT_FALSE(r.is_ok());
  auto d = Tokenizer::load_dir("/nonexistent");
  EXPECT_FALSE(d.is_ok());
  auto bad = Tokenizer::from_json_text("{not json", "");
  EXPECT_FALSE(bad.is_ok());
}

}  // namespace
}  // namespace lily
