// Generated ids → text for the reply parsers. Special tokens are dropped (HF's
// skip_special_tokens), except the reasoning and tool-call markers, which are written out
// literally whether or not the tokenizer flags them special: the parsers need to see them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "text/stream_decoder.h"
#include "text/tokenizer.h"

namespace lily {

class TokenText {
 public:
  explicit TokenText(const Tokenizer& tok);
  std::string push(int32_t id);
  std::string flush();

 private:
  StreamDecoder dec_;
  std::vector<std::pair<int32_t, std::string>> markers_;  // id → literal text
};

}  // namespace lily
