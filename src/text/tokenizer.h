// Tokenizer: a HF tokenizer.json of the Qwen family (byte-level BPE) loaded into lily, with
// encode/decode matching the HF `tokenizers` library (encode with add_special_tokens=false;
// decode with lossy UTF-8), plus what the engine needs: stop ids and the reasoning/tool markers.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/pipeline.h"

namespace lily {

class Tokenizer {
 public:
  // tokenizer.json path; tokenizer_config.json path may be empty (then no eos/bos strings).
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json,
                                                 const std::string& tokenizer_config_json);
  // dir/tokenizer.json (+ dir/tokenizer_config.json if present)
  static Result<std::unique_ptr<Tokenizer>> load_dir(const std::string& dir);
  // From JSON text already in memory (tests); config_json may be empty.
  static Result<std::unique_ptr<Tokenizer>> from_json_text(const std::string& tokenizer_json,
                                                           const std::string& config_json);

  // Like HF encode(text, add_special_tokens=false). Never throws or crashes on any bytes:
  // invalid UTF-8 is first repaired with U+FFFD per maximal invalid subpart.
  std::vector<int32_t> encode(std::string_view text) const;
  // Like HF decode(ids, skip_special_tokens). Unknown ids are skipped, as HF does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;  // vocab or added token, exact text
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;  // an added token (tokenizer.json added_tokens), special or not
  int32_t vocab_size() const;  // max id + 1 over vocab and added tokens
  const std::string& bos_token() const { return bos_token_; }  // from tokenizer_config.json ("" if none)
  const std::string& eos_token() const { return eos_token_; }
  std::optional<int32_t> eos_id() const;
  // tokenizer eos + config eos list, deduplicated (eos first, then the list in order)
  std::vector<int32_t> stop_ids(const std::vector<int>& config_eos_ids) const;
  struct MarkerIds {
    std::optional<int32_t> think_open, think_close, tool_call_open, tool_call_close;
  };
  const MarkerIds& markers() const { return markers_; }

  // The bytes id decodes to (before UTF-8 repair) and whether decode shows it; used by
  // StreamDecoder. nullptr for an unknown id.
  const std::string* token_bytes(int32_t id) const;

 private:
  Tokenizer() = default;
  Status init_from_json(const std::string& tokenizer_json);
  Status init_config(const std::string& config_json);
  void encode_normalized_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::unique_ptr<BpeModel> model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  std::vector<AddedToken> added_;                    // file order
  std::unordered_map<std::string, int32_t> added_by_content_;
  AddedTokenMatcher raw_matcher_;   // tokens with normalized=false, matched on the input
  AddedTokenMatcher norm_matcher_;  // tokens with normalized=true, matched after normalization
  std::vector<std::string> id_bytes_;  // [vocab_size] what each id decodes to
  std::vector<uint8_t> id_flags_;      // [vocab_size] kKnown | kSpecial
  std::string bos_token_, eos_token_;
  MarkerIds markers_;
};

}  // namespace lily
