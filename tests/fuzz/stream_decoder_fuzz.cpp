// Fuzz target: the streaming detokenizer on arbitrary id sequences (2 bytes per id, spanning
// the vocabulary and some ids past it). What push() and flush() emit concatenates to
// Tokenizer::decode of the whole sequence, and each piece is valid UTF-8 on its own.
#include "fuzz_util.h"
#include "text/stream_decoder.h"
#include "text/utf8.h"

LILY_FUZZ_PRELOAD(lily::fuzz::qwen_tokenizer())

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  const Tokenizer& tok = fuzz::qwen_tokenizer();
  if (size < 1) return 0;
  const bool skip = data[0] & 1;
  // Ids: 17 bits from 3 bytes, so both ordinary and added/special tokens (151643+) are reached,
  // plus negative and past-the-end ids from the high bit patterns.
  std::vector<int32_t> ids;
  for (size_t i = 1; i + 3 <= size; i += 3) {
    uint32_t v = uint32_t(data[i]) | uint32_t(data[i + 1]) << 8 | uint32_t(data[i + 2]) << 16;
    int32_t id = int32_t(v % 160000u);
    if (v >> 23) id = -id - 1;  // a few negative ids
    ids.push_back(id);
  }
  StreamDecoder dec(tok, skip);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = dec.push(id);
    LILY_FUZZ_ASSERT(utf8::is_valid(piece), "a pushed piece is not valid UTF-8");
    streamed += piece;
  }
  std::string rest = dec.flush();
  LILY_FUZZ_ASSERT(utf8::is_valid(rest), "flush is not valid UTF-8");
  streamed += rest;
  LILY_FUZZ_ASSERT(streamed == tok.decode(ids, skip), "stream != decode");
  return 0;
}
