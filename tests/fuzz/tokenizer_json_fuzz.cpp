// Fuzz target: loading a tokenizer.json (and, after kSep, a tokenizer_config.json) from bytes.
// A file that loads must then encode and decode without crashing, with ids inside its vocabulary.
#include "fuzz_util.h"
#include "text/stream_decoder.h"
#include "text/utf8.h"

namespace {
constexpr std::string_view kSep = "\n#--lily-fuzz-config--#\n";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lily;
  auto parts = fuzz::split(std::string_view(reinterpret_cast<const char*>(data), size), kSep);
  auto r = Tokenizer::from_json_text(std::string(parts[0]), parts.size() > 1 ? std::string(parts[1]) : std::string());
  if (!r.is_ok()) {
    LILY_FUZZ_ASSERT(!r.message().empty(), "an error without a message");
    return 0;
  }
  const Tokenizer& tok = *r.value();
  for (std::string_view text : {std::string_view("Hello, world! <think>x</think> \xC3\xA9\xE4\xB8\xAD \xFF\x80 12345"),
                                std::string_view("  \n\n\t<|im_start|>user\nhi<|im_end|>")}) {
    std::vector<int32_t> ids = tok.encode(text);
    for (int32_t id : ids) LILY_FUZZ_ASSERT(id >= 0 && id < tok.vocab_size(), std::to_string(id));
    std::string back = tok.decode(ids, false);
    LILY_FUZZ_ASSERT(utf8::is_valid(back), "decode gave invalid UTF-8");
    StreamDecoder dec(tok, true);
    std::string streamed;
    for (int32_t id : ids) streamed += dec.push(id);
    streamed += dec.flush();
    LILY_FUZZ_ASSERT(streamed == tok.decode(ids, true), "stream != decode");
  }
  (void)tok.stop_ids({0, 1});
  (void)tok.markers();
  return 0;
}
