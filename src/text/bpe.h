// Byte-level BPE model of a HF tokenizer.json: vocab, ranked merges and the merge loop.
// Works on raw bytes: each vocab string is mapped from the ByteLevel alphabet back to the bytes
// it stands for at load, so encode never builds the byte-level string. Results are cached per
// pre-token (thread-safe), which is what makes repeated words cheap.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace lily {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object. Fails naming any unsupported option.
  static Result<std::unique_ptr<BpeModel>> from_json(const nlohmann::json& model);

  // Appends the ids of one pre-token (raw bytes, after normalization and splitting).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;  // vocab string as in the file
  // The token string as written in the file, or nullptr for an id not in the vocab.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  size_t n_merges() const { return merges_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  void merge_uncached(std::string_view word, std::vector<int32_t>& out) const;
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  const Merge* find_merge(int32_t a, int32_t b) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;        // file strings
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> bytes_vocab_;  // raw bytes
  std::vector<std::string> id_to_token_;  // [max_id+1], "" where no token
  std::vector<bool> has_id_;
  int32_t byte_id_[256];                  // id of the single-byte token, -1 if absent
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  // Pre-token cache: bytes -> ids. Cleared wholesale when it grows past a bound.
  mutable std::shared_mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
  mutable size_t cache_bytes_ = 0;
};

}  // namespace lily
