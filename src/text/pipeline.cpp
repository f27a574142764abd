// Normalizer and pre-tokenizer from tokenizer.json. A Split step cuts each piece on its own
// (pattern anchors and look-aheads see the piece's ends), keeps matches and gaps as separate
// pieces (Isolated) and drops empty ones, as HF's PreTokenizedString::split does.
#include "text/pipeline.h"

#include <nlohmann/json.hpp>

#include "text/unicode.h"

namespace lily {
namespace {
// HF ByteLevel's built-in split pattern (GPT-2), used when use_regex is true.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status add_normalizer(const nlohmann::json& j, bool& nfc) {
  if (j.is_null()) return Status::ok();
  std::string type = j.value("type", "");
  if (type == "NFC") {
    nfc = true;
    return Status::ok();
  }
  if (type == "Sequence") {
    for (const auto& n : j.value("normalizers", nlohmann::json::array())) LILY_TRY(add_normalizer(n, nfc));
    return Status::ok();
  }
  return errorf("tokenizer.json: normalizer '{}' is not supported (supported: NFC, Sequence)", type);
}
}  // namespace

Result<Normalizer> Normalizer::from_json(const nlohmann::json& j) {
  Normalizer n;
  LILY_TRY(add_normalizer(j, n.nfc_));
  return n;
}

bool Normalizer::apply_into(std::string_view s, std::string& out) const {
  return nfc_ && unicode::nfc_into(s, out);
}

std::string Normalizer::apply(std::string_view s) const {
  if (!nfc_) return std::string(s);
  return unicode::nfc(s);
}

Status PreTokenizer::add_json(const nlohmann::json& j, std::vector<Step>& steps) {
  if (j.is_null()) return Status::ok();
  std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : j.value("pretokenizers", nlohmann::json::array())) LILY_TRY(add_json(p, steps));
    return Status::ok();
  }
  if (type == "Split") {
    if (j.value("invert", false)) return errorf("tokenizer.json: pre_tokenizer Split invert=true is not supported");
    std::string behavior = j.value("behavior", "");
    if (behavior != "Isolated" && behavior != "Removed")
      return errorf("tokenizer.json: pre_tokenizer Split behavior '{}' is not supported (Isolated, Removed)", behavior);
    const auto& pat = j.at("pattern");
    bool literal = pat.contains("String");
    if (!literal && !pat.contains("Regex")) return errorf("tokenizer.json: Split pattern is neither Regex nor String");
    LILY_ASSIGN_OR_RETURN(auto re, Regex::compile(pat.at(literal ? "String" : "Regex").get<std::string>(), literal));
    steps.push_back({std::shared_ptr<Regex>(std::move(re)), behavior == "Removed"});
    return Status::ok();
  }
  if (type == "ByteLevel") {
    if (j.value("add_prefix_space", false))
      return errorf("tokenizer.json: pre_tokenizer ByteLevel add_prefix_space=true is not supported");
    if (j.value("use_regex", true)) {
      LILY_ASSIGN_OR_RETURN(auto re, Regex::compile(kByteLevelPattern, false));
      steps.push_back({std::shared_ptr<Regex>(std::move(re)), false});
    }
    return Status::ok();  // the byte mapping itself is implicit: the BPE model works on bytes
  }
  return errorf("tokenizer.json: pre_tokenizer '{}' is not supported (Split, ByteLevel, Sequence)", type);
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer p;
  LILY_TRY(add_json(j, p.steps_));
  return p;
}

void PreTokenizer::split(std::string_view s, const std::function<void(std::string_view)>& fn) const {
  if (!s.empty()) run(0, s, fn);
}

void PreTokenizer::run(size_t step, std::string_view s, const std::function<void(std::string_view)>& fn) const {
  if (step == steps_.size()) {
    fn(s);
    return;
  }
  const Step& st = steps_[step];
  size_t prev = 0;
  bool ok = st.regex->for_each_match(s, [&](size_t ms, size_t me) {
    if (ms > prev) run(step + 1, s.substr(prev, ms - prev), fn);
    if (me > ms && !st.remove_matches) run(step + 1, s.substr(ms, me - ms), fn);
    prev = me;
  });
  (void)ok;  // on a PCRE2 resource error the unmatched rest stays one piece: wrong ids, never a crash
  if (prev < s.size()) run(step + 1, s.substr(prev), fn);
}

}  // namespace lily
