// Keeps only a trailing incomplete-but-still-valid UTF-8 prefix pending; everything before it
// is final, because the lossy repair of a prefix never depends on bytes that come later.
#include "text/stream_decoder.h"

#include "text/utf8.h"

namespace lily {

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool skip_special_tokens)
    : tok_(tok), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int32_t id) {
  const std::string* b = tok_.token_bytes(id);
  if (!b || (skip_special_ && tok_.is_special(id))) return {};
  pending_ += *b;
  size_t n = utf8::stable_prefix_len(pending_);
  if (n == 0) return {};
  std::string out;
  utf8::append_lossy(std::string_view(pending_).substr(0, n), out);
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::to_valid_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace lily
