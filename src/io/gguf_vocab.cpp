// GGUF tokenizer metadata from tokenizer.json (see gguf_vocab.h). Token types follow llama.cpp's
// converter: vocab entries are Normal; added tokens are Control when special (or shaped
// "<|...|>") and UserDefined otherwise; ids no token has are Unused "[PAD<id>]".
#include "io/gguf_vocab.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/json_depth.h"
#include "core/json_int.h"

namespace lily::gguf {
namespace {

using nlohmann::json;
constexpr size_t kMaxJsonDepth = 64;

// The Split regexes of the Qwen3 and Qwen3.5 tokenizers, and llama.cpp's names for them.
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

Result<json> read_json(const std::string& path) {
  LILY_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  if (json_nesting_depth(text) > kMaxJsonDepth) return errorf("{} nests deeper than {} levels", path, kMaxJsonDepth);
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return errorf("{} is not a JSON object", path);
  return j;
}

// The first Split regex of the pre-tokenizer (a Sequence or a single Split).
std::string split_regex(const json& pre) {
  if (!pre.is_object()) return "";
  if (pre.value("type", "") == "Split" && pre.contains("pattern") && pre["pattern"].is_object())
    return pre["pattern"].value("Regex", "");
  if (pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array())
    for (const auto& p : pre["pretokenizers"]) {
      std::string r = split_regex(p);
      if (!r.empty()) return r;
    }
  return "";
}

Result<std::string> pre_name(const json& tok) {
  const std::string re = split_regex(tok.value("pre_tokenizer", json()));
  if (re == kQwen2Regex) return std::string("qwen2");
  if (re == kQwen35Regex) return std::string("qwen35");
  return errorf("tokenizer.json: pre-tokenizer regex '{}' is not one llama.cpp's qwen2/qwen35 implement", re);
}

bool looks_special(const std::string& t) { return t.size() >= 4 && t.starts_with("<|") && t.ends_with("|>"); }

// tokenizer_config.json token fields are a string, null or an AddedToken object.
std::string config_token(const json& cfg, const char* key) {
  if (!cfg.contains(key)) return "";
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

Status fill_tokens(const json& tok, int vocab_size, Vocab& v) {
  const json& model = tok.at("model");
  if (model.value("type", "") != "BPE") return Status::error("tokenizer.json: model.type is not BPE");
  v.tokens.assign(size_t(vocab_size), "");
  v.types.assign(size_t(vocab_size), int32_t(TokenType::Unused));
  std::vector<bool> have(size_t(vocab_size), false);
  auto put = [&](const json& idj, const std::string& text, TokenType type) -> Status {
    const auto id = json_int(idj, 0, int64_t(vocab_size) - 1);
    if (!id) return errorf("tokenizer.json: the id of '{}' is no integer inside the vocab of {}", text, vocab_size);
    v.tokens[size_t(*id)] = text;
    v.types[size_t(*id)] = int32_t(type);
    have[size_t(*id)] = true;
    return Status::ok();
  };
  if (!model.at("vocab").is_object()) return Status::error("tokenizer.json: model.vocab is not an object");
  for (const auto& [text, id] : model.at("vocab").items()) LILY_TRY(put(id, text, TokenType::Normal));
  for (const auto& a : tok.value("added_tokens", json::array())) {
    const std::string text = a.at("content").get<std::string>();
    const bool control = a.value("special", false) || looks_special(text);
    LILY_TRY(put(a.at("id"), text, control ? TokenType::Control : TokenType::UserDefined));
  }
  for (int id = 0; id < vocab_size; ++id)
    if (!have[size_t(id)]) v.tokens[size_t(id)] = fmt::format("[PAD{}]", id);
  const json merges = model.value("merges", json::array());
  if (!merges.is_array()) return Status::error("tokenizer.json: model.merges is not an array");
  for (const auto& m : merges) {
    if (m.is_string()) v.merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2) v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else return Status::error("tokenizer.json: a merge is neither \"a b\" nor [a, b]");
  }
  return Status::ok();
}

std::optional<int32_t> id_of(const Vocab& v, const std::string& text) {
  if (text.empty()) return std::nullopt;
  for (size_t i = 0; i < v.tokens.size(); ++i)
    if (v.tokens[i] == text && v.types[i] != int32_t(TokenType::Unused)) return int32_t(i);
  return std::nullopt;
}

}  // namespace

Result<Vocab> read_vocab(const std::string& dir, int vocab_size, const std::vector<int>& fallback_eos) {
  namespace fs = std::filesystem;
  LILY_ASSIGN_OR_RETURN(json tok, read_json((fs::path(dir) / "tokenizer.json").string()));
  Vocab v;
  try {
    LILY_ASSIGN_OR_RETURN(v.pre, pre_name(tok));
    LILY_TRY(fill_tokens(tok, vocab_size, v));
  } catch (const json::exception& e) {
    return errorf("{}/tokenizer.json: {}", dir, e.what());
  }
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    LILY_ASSIGN_OR_RETURN(json cfg, read_json(cfg_path.string()));
    v.eos_id = id_of(v, config_token(cfg, "eos_token"));
    v.pad_id = id_of(v, config_token(cfg, "pad_token"));
    v.add_bos = cfg.value("add_bos_token", false);
  }
  if (!v.eos_id && !fallback_eos.empty() && fallback_eos[0] >= 0 && fallback_eos[0] < vocab_size)
    v.eos_id = fallback_eos[0];
  return v;
}

void add_vocab(Writer& w, const Vocab& v) {
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", v.pre);
  w.add_array_string("tokenizer.ggml.tokens", v.tokens);
  w.add_array_i32("tokenizer.ggml.token_type", v.types);
  w.add_array_string("tokenizer.ggml.merges", v.merges);
  if (v.eos_id) w.add_u32("tokenizer.ggml.eos_token_id", uint32_t(*v.eos_id));
  if (v.pad_id) w.add_u32("tokenizer.ggml.padding_token_id", uint32_t(*v.pad_id));
  w.add_bool("tokenizer.ggml.add_bos_token", v.add_bos);
}

}  // namespace lily::gguf
