// StreamDecoder: incremental detokenization for streaming responses. Emits text only once
// it is complete UTF-8, and the concatenation of everything push() and flush() return equals
// Tokenizer::decode of the whole sequence (same U+FFFD repair, same special-token skipping).
#pragma once
#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace lily {

class StreamDecoder {  // text only when complete UTF-8 is available
 public:
  StreamDecoder(const Tokenizer& tok, bool skip_special_tokens);
  std::string push(int32_t id);  // newly completed text (may be empty)
  std::string flush();           // whatever remains (incomplete bytes -> U+FFFD like HF's lossy decode)

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: at most a trailing incomplete character
};

}  // namespace lily
