// Loading tokenizer.json and running HF's encode pipeline: split on non-normalized added
// tokens, normalize each remaining piece, split on normalized added tokens, pre-tokenize, BPE.
// Decode maps each id to bytes (ByteLevel decoder; a token with a char outside the alphabet
// keeps its raw UTF-8, as HF does), concatenates and repairs invalid UTF-8 with U+FFFD.
#include "text/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/json_depth.h"
#include "core/json_int.h"
#include "text/byte_level.h"
#include "text/utf8.h"

namespace lily {
namespace {

constexpr uint8_t kKnown = 1, kSpecial = 2, kAdded = 4;
// tokenizer.json nests a few levels (Sequence of pre-tokenizers); the stages are read recursively.
constexpr size_t kMaxJsonDepth = 64;

// tokenizer_config.json token fields are a string, null, or an AddedToken object.
std::string config_token(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

Status check_decoder(const nlohmann::json& d) {
  if (d.is_null()) return errorf("tokenizer.json: decoder is null; only ByteLevel is supported");
  std::string type = d.value("type", "");
  if (type == "ByteLevel") return Status::ok();
  if (type == "Sequence") {
    const auto& ds = d.value("decoders", nlohmann::json::array());
    if (ds.size() == 1) return check_decoder(ds[0]);
  }
  return errorf("tokenizer.json: decoder '{}' is not supported (only ByteLevel)", type);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& tokenizer_json,
                                                   const std::string& tokenizer_config_json) {
  LILY_ASSIGN_OR_RETURN(std::string tj, read_file(tokenizer_json));
  std::string cj;
  if (!tokenizer_config_json.empty()) {
    LILY_ASSIGN_OR_RETURN(cj, read_file(tokenizer_config_json));
  }
  auto r = from_json_text(tj, cj);
  if (!r.is_ok()) return errorf("{}: {}", tokenizer_json, r.message());
  return r;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path tj = fs::path(dir) / "tokenizer.json";
  fs::path cj = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(tj)) return errorf("{} has no tokenizer.json", dir);
  return load(tj.string(), fs::exists(cj) ? cj.string() : std::string());
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(const std::string& tokenizer_json,
                                                             const std::string& config_json) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  try {
    LILY_TRY(t->init_from_json(tokenizer_json));
    if (!config_json.empty()) LILY_TRY(t->init_config(config_json));
  } catch (const nlohmann::json::exception& e) {
    return errorf("malformed tokenizer JSON: {}", e.what());
  }
  auto& m = t->markers_;
  m.think_open = t->token_to_id("<think>");
  m.think_close = t->token_to_id("</think>");
  m.tool_call_open = t->token_to_id("<tool_call>");
  m.tool_call_close = t->token_to_id("</tool_call>");
  return t;
}

Status Tokenizer::init_from_json(const std::string& text) {
  if (json_nesting_depth(text) > kMaxJsonDepth) return errorf("tokenizer.json nests deeper than {} levels", kMaxJsonDepth);
  nlohmann::json j = nlohmann::json::parse(text);
  if (!j.is_object()) return errorf("tokenizer.json is not an object");
  if (j.contains("truncation") && !j["truncation"].is_null())
    return errorf("tokenizer.json: truncation is set; not supported");
  if (j.contains("padding") && !j["padding"].is_null()) return errorf("tokenizer.json: padding is set; not supported");
  LILY_ASSIGN_OR_RETURN(model_, BpeModel::from_json(j.at("model")));
  LILY_ASSIGN_OR_RETURN(normalizer_, Normalizer::from_json(j.value("normalizer", nlohmann::json())));
  LILY_ASSIGN_OR_RETURN(pre_tokenizer_, PreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json())));
  LILY_TRY(check_decoder(j.value("decoder", nlohmann::json())));
  // post_processor: with add_special_tokens=false the HF processors add nothing and only touch
  // offsets, so any is accepted and ignored.

  for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    const auto id = json_int(a.at("id"), 0, INT32_MAX);  // (tokenizer_json_fuzz: a 43-digit id read as an int)
    if (!id) return errorf("tokenizer.json: added token '{}' has no integer id in [0, {}]", t.content, INT32_MAX);
    t.id = int32_t(*id);
    t.single_word = a.value("single_word", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.special = a.value("special", false);
    t.normalized = a.value("normalized", !t.special);
    if (!utf8::is_valid(t.content)) return errorf("tokenizer.json: added token {} is not UTF-8", t.id);
    if (auto vid = model_->token_to_id(t.content); vid && *vid != t.id)
      return errorf("tokenizer.json: added token '{}' has id {} but the vocab has it as {}", t.content, t.id, *vid);
    if (t.content.empty()) continue;  // HF ignores empty added tokens
    if (added_by_content_.count(t.content)) continue;
    added_by_content_[t.content] = t.id;
    added_.push_back(std::move(t));
  }
  // HF matches special tokens ahead of the other added tokens when patterns are equal.
  std::vector<const AddedToken*> raw, norm;
  std::vector<std::string> raw_pat, norm_pat;
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& t : added_) {
      if (t.special != (pass == 0)) continue;
      if (t.normalized) {
        norm.push_back(&t);
        norm_pat.push_back(normalizer_.apply(t.content));
      } else {
        raw.push_back(&t);
        raw_pat.push_back(t.content);
      }
    }
  }
  raw_matcher_.build(raw, raw_pat);
  norm_matcher_.build(norm, norm_pat);

  // id -> bytes and flags.
  int32_t max_id = model_->max_id();
  for (const auto& t : added_) max_id = std::max(max_id, t.id);
  id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  id_flags_.assign(static_cast<size_t>(max_id + 1), 0);
  auto set = [&](int32_t id, const std::string& tok, uint8_t flags) {
    auto raw_bytes = byte_level::decode(tok);
    id_bytes_[id] = raw_bytes ? std::move(*raw_bytes) : tok;
    id_flags_[id] = flags;
  };
  for (int32_t id = 0; id <= model_->max_id(); ++id)
    if (const std::string* tok = model_->id_to_token(id)) set(id, *tok, kKnown);
  for (const auto& t : added_) set(t.id, t.content, static_cast<uint8_t>(kKnown | kAdded | (t.special ? kSpecial : 0)));
  return Status::ok();
}

Status Tokenizer::init_config(const std::string& text) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    return errorf("tokenizer_config.json nests deeper than {} levels", kMaxJsonDepth);
  nlohmann::json c = nlohmann::json::parse(text);
  if (!c.is_object()) return errorf("tokenizer_config.json is not an object");
  bos_token_ = config_token(c, "bos_token");
  eos_token_ = config_token(c, "eos_token");
  if (!eos_token_.empty() && !token_to_id(eos_token_))
    return errorf("tokenizer_config.json: eos_token '{}' is not a token", eos_token_);
  return Status::ok();
}

void Tokenizer::encode_normalized_piece(std::string_view piece, std::vector<int32_t>& out) const {
  pre_tokenizer_.split(piece, [&](std::string_view word) { model_->encode_word(word, out); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::to_valid_lossy(text);
    text = repaired;
  }
  out.reserve(text.size() / 3 + 4);
  std::vector<Split> splits, nsplits;
  std::string normalized;
  if (raw_matcher_.empty()) {
    splits.push_back({0, text.size(), -1});
  } else {
    raw_matcher_.split(text, splits);
  }
  for (const Split& sp : splits) {
    if (sp.id >= 0) {
      out.push_back(sp.id);
      continue;
    }
    std::string_view piece = text.substr(sp.start, sp.end - sp.start);
    if (normalizer_.apply_into(piece, normalized)) piece = normalized;
    if (norm_matcher_.empty()) {
      encode_normalized_piece(piece, out);
      continue;
    }
    nsplits.clear();
    norm_matcher_.split(piece, nsplits);
    for (const Split& ns : nsplits) {
      if (ns.id >= 0) {
        out.push_back(ns.id);
      } else {
        encode_normalized_piece(piece.substr(ns.start, ns.end - ns.start), out);
      }
    }
  }
  return out;
}

const std::string* Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_flags_.size() || !(id_flags_[id] & kKnown)) return nullptr;
  return &id_bytes_[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    const std::string* b = token_bytes(id);
    if (!b) continue;
    if (skip_special_tokens && is_special(id)) continue;
    bytes += *b;
  }
  if (utf8::is_valid(bytes)) return bytes;
  return utf8::to_valid_lossy(bytes);
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = added_by_content_.find(std::string(token));
  if (it != added_by_content_.end()) return it->second;
  return model_->token_to_id(token);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < id_flags_.size() && (id_flags_[id] & kSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < id_flags_.size() && (id_flags_[id] & kAdded);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(id_flags_.size()); }

std::optional<int32_t> Tokenizer::eos_id() const {
  if (eos_token_.empty()) return std::nullopt;
  return token_to_id(eos_token_);
}

std::vector<int32_t> Tokenizer::stop_ids(const std::vector<int>& config_eos_ids) const {
  std::vector<int32_t> out;
  auto add = [&](int32_t id) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (auto e = eos_id()) add(*e);
  for (int id : config_eos_ids) add(static_cast<int32_t>(id));
  return out;
}

}  // namespace lily
