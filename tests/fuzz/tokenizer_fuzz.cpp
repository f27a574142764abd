// Fuzz target: encode/decode of arbitrary bytes with the real Qwen3 tokenizer. Properties:
// every id is in the vocabulary; decode(encode(s)) is the NFC of s's lossy UTF-8 repair (the
// Qwen normalizer is NFC, decode is lossy), which also makes decode's output valid UTF-8.
#include "fuzz_util.h"
#include "text/unicode.h"
#include "text/utf8.h"

LILY_FUZZ_PRELOAD(lily::fuzz::qwen_tokenizer())

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  const Tokenizer& tok = fuzz::qwen_tokenizer();
  std::string_view s(reinterpret_cast<const char*>(data), size);
  std::vector<int32_t> ids = tok.encode(s);
  for (int32_t id : ids) LILY_FUZZ_ASSERT(id >= 0 && id < tok.vocab_size() && tok.token_bytes(id), std::to_string(id));
  LILY_FUZZ_ASSERT(ids.empty() == s.empty(), "empty encoding of a non-empty string");
  std::string back = tok.decode(ids, /*skip_special_tokens=*/false);
  LILY_FUZZ_ASSERT(utf8::is_valid(back), "decode gave invalid UTF-8");
  std::string want = unicode::nfc(utf8::to_valid_lossy(s));
  LILY_FUZZ_ASSERT(back == want, "decode(encode(s)) != NFC(lossy(s))");
  // Decoding with special tokens skipped is still valid UTF-8 and never longer.
  std::string skipped = tok.decode(ids, /*skip_special_tokens=*/true);
  LILY_FUZZ_ASSERT(utf8::is_valid(skipped) && skipped.size() <= back.size(), "skip_special_tokens");
  return 0;
}
