// The tokenizer metadata llama.cpp reads from a GGUF, built from a checkpoint's tokenizer.json
// (byte-level BPE of the Qwen family) and tokenizer_config.json: tokenizer.ggml.model "gpt2",
// the pre-tokenizer name, every id's token text (padded to the model's vocab size with
// "[PAD<id>]"), token types, merges and the special ids. Mirrors what llama.cpp's converter
// writes for Qwen checkpoints.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/gguf_writer.h"

namespace lily::gguf {

// llama.cpp token types.
enum class TokenType : int32_t { Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6 };

struct Vocab {
  std::string pre;                    // "qwen2" (Qwen3 tokenizer) or "qwen35" (Qwen3.5 tokenizer)
  std::vector<std::string> tokens;    // [vocab_size] byte-level text of each id
  std::vector<int32_t> types;         // [vocab_size] TokenType
  std::vector<std::string> merges;    // "left right", rank order
  std::optional<int32_t> eos_id, pad_id;
  bool add_bos = false;
};

// dir/tokenizer.json (+ dir/tokenizer_config.json when present). vocab_size is the model's
// (embedding rows); ids the tokenizer lacks become "[PAD<id>]" of type Unused. A pre-tokenizer
// that is not one of the two Qwen regexes llama.cpp implements is an error naming it.
// fallback_eos: the config's eos ids, used when tokenizer_config.json names none.
Result<Vocab> read_vocab(const std::string& dir, int vocab_size, const std::vector<int>& fallback_eos);

// Adds the tokenizer.ggml.* keys.
void add_vocab(Writer& w, const Vocab& v);

}  // namespace lily::gguf
