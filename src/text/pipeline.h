// The normalizer and pre-tokenizer stages of a tokenizer.json, parsed into what lily runs.
// Supported: normalizer NFC (alone or in Sequences; null); pre-tokenizers Split (Regex or
// String pattern, Isolated or Removed, invert=false), ByteLevel (add_prefix_space=false; its
// use_regex split included) and Sequences of them. Anything else fails at load, named.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "text/regex.h"

namespace lily {

class Normalizer {
 public:
  static Result<Normalizer> from_json(const nlohmann::json& j);  // j may be null
  bool active() const { return nfc_; }
  std::string apply(std::string_view s) const;
  // Like apply, but returns false (out untouched) when s is already normalized.
  bool apply_into(std::string_view s, std::string& out) const;

 private:
  bool nfc_ = false;
};

class PreTokenizer {
 public:
  static Result<PreTokenizer> from_json(const nlohmann::json& j);  // j may be null

  // Calls fn(pre_token) for each non-empty pre-token of s (valid UTF-8), in order.
  void split(std::string_view s, const std::function<void(std::string_view)>& fn) const;

 private:
  struct Step {
    std::shared_ptr<Regex> regex;
    bool remove_matches = false;  // Split behavior Removed (else Isolated)
  };
  static Status add_json(const nlohmann::json& j, std::vector<Step>& steps);
  void run(size_t step, std::string_view s, const std::function<void(std::string_view)>& fn) const;
  std::vector<Step> steps_;
};

}  // namespace lily
