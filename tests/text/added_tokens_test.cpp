// Added-token matching flags on a small hand-made tokenizer.json: 256 byte tokens (id = byte
// value), no merges, so every id in an expected output is either a byte or an added token.
// Expected outputs follow HF's documented rules (AddedVocabulary::find_matches): leftmost then
// longest match; lstrip/rstrip absorb neighbouring White_Space; single_word needs non-word
// neighbours; normalized tokens are matched after the normalizer, the others before it.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tok_test_util.h"

namespace lily {
namespace {

enum : int32_t { kA = 1000, kB, kW, kE, kN, kX, kXX, kSp, kThink, kEos };

nlohmann::json base_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (unsigned b = 0; b < 256; ++b) vocab[test::byte_char(b)] = b;
  auto tok = [](int id, const char* content, bool special, bool lstrip, bool rstrip, bool normalized, bool single_word) {
    return nlohmann::json{{"id", id},         {"content", content}, {"special", special}, {"lstrip", lstrip},
                          {"rstrip", rstrip}, {"normalized", normalized}, {"single_word", single_word}};
  };
  nlohmann::json added = nlohmann::json::array({
      tok(kA, "<a>", true, false, true, false, false),          // rstrip
      tok(kB, "<b>", true, true, false, false, false),          // lstrip
      tok(kW, "<w>", false, false, false, false, true),         // single_word
      tok(kE, "\xC7\x98", false, false, false, true, false),    // "ǘ", normalized: matches NFD input
      tok(kN, "\xE1\xBA\xBD", false, false, false, false, false),  // "ẽ", not normalized: raw text only
      tok(kX, "<x>", false, false, false, false, false),
      tok(kXX, "<x>>", false, false, false, false, false),      // longer, same start
      tok(kSp, "<sp>", true, false, false, false, false),
      tok(kThink, "<think>", false, false, false, false, false),
      tok(kEos, "<eos>", true, false, false, false, false),
  });
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"fuse_unk", false},
                     {"byte_fallback", false}, {"ignore_merges", false}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
}

std::unique_ptr<Tokenizer> make(const nlohmann::json& j, const std::string& config = "") {
  auto r = Tokenizer::from_json_text(j.dump(), config);
  EXPECT_TRUE(r.is_ok()) << (r.is_ok() ? "" : r.message());
  return r.is_ok() ? std::move(r.value()) : nullptr;
}

std::vector<int32_t> bytes(std::string_view s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}
std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

TEST(AddedTokens, RstripAbsorbsFollowingWhitespace) {
  auto t = make(base_json());
  EXPECT_EQ(t->encode("<a> \t\n x"), cat({{kA}, bytes("x")}));
  EXPECT_EQ(t->encode(" <a>x"), cat({bytes(" "), {kA}, bytes("x")}));  // no lstrip: space before stays
  EXPECT_EQ(t->encode("<a>\u3000\u00a0y"), cat({{kA}, bytes("y")}));      // Unicode White_Space too
}

TEST(AddedTokens, LstripAbsorbsPrecedingWhitespace) {
  auto t = make(base_json());
  EXPECT_EQ(t->encode("x \t\n <b>y"), cat({bytes("x"), {kB}, bytes("y")}));
  EXPECT_EQ(t->encode("x<b> y"), cat({bytes("x"), {kB}, bytes(" y")}));  // no rstrip
  EXPECT_EQ(t->encode("   <b>"), std::vector<int32_t>({kB}));
}

TEST(AddedTokens, LstripDoesNotReclaimWhatAnEarlierTokenTook) {
  auto t = make(base_json());
  EXPECT_EQ(t->encode("<a>   <b>"), std::vector<int32_t>({kA, kB}));
  EXPECT_EQ(t->encode("<sp>  <b>"), std::vector<int32_t>({kSp, kB}));
}

TEST(AddedTokens, SingleWordNeedsNonWordNeighbours) {
  auto t = make(base_json());
  EXPECT_EQ(t->encode("a<w>b"), bytes("a<w>b"));
  EXPECT_EQ(t->encode("a <w> b"), cat({bytes("a "), {kW}, bytes(" b")}));
  EXPECT_EQ(t->encode("<w>,"), cat({{kW}, bytes(",")}));
  EXPECT_EQ(t->encode("_<w>"), bytes("_<w>"));     // '_' is a word character
  EXPECT_EQ(t->encode("1<w>"), bytes("1<w>"));
  EXPECT_EQ(t->encode("\xC3\xA9<w>"), bytes("\xC3\xA9<w>"));  // so is é
}

TEST(AddedTokens, NormalizedTokensMatchAfterNfcOthersBefore) {
  auto t = make(base_json());
  EXPECT_EQ(t->encode("u\xCC\x88\xCC\x81"), std::vector<int32_t>({kE}));  // u + U+0308 + U+0301 -> ǘ after NFC
  EXPECT_EQ(t->encode("\xC7\x98"), std::vector<int32_t>({kE}));
  EXPECT_EQ(t->encode("\xE1\xBA\xBD"), std::vector<int32_t>({kN}));      // raw ẽ matches
  EXPECT_EQ(t->encode("e\xCC\x83"), bytes("\xE1\xBA\xBD"));            // NFD ẽ only becomes ẽ after
}

TEST(AddedTokens, LeftmostThenLongest) {
  auto t = make(base_json());
  EXPECT_EQ(t->encode("<x>>"), std::vector<int32_t>({kXX}));
  EXPECT_EQ(t->encode("a<x>><x>"), cat({bytes("a"), {kXX}, {kX}}));
  EXPECT_EQ(t->encode("<x<x>"), cat({bytes("<x"), {kX}}));
  EXPECT_EQ(t->encode("<<think>>"), cat({bytes("<"), {kThink}, bytes(">")}));
}

TEST(AddedTokens, DecodeSkipsOnlySpecialTokens) {
  auto t = make(base_json());
  std::vector<int32_t> ids = cat({bytes("hi"), {kEos}, {kThink}, {kA}, bytes("!")});
  EXPECT_EQ(t->decode(ids, false), "hi<eos><think><a>!");
  EXPECT_EQ(t->decode(ids, true), "hi<think>!");
  EXPECT_TRUE(t->is_special(kEos));
  EXPECT_FALSE(t->is_special(kThink));
  EXPECT_FALSE(t->is_special('h'));
  EXPECT_FALSE(t->is_special(-1));
}

TEST(AddedTokens, LookupsStopIdsAndMarkers) {
  auto t = make(base_json(), R"({"eos_token": "<eos>", "bos_token": null})");
  EXPECT_EQ(t->token_to_id("<think>"), kThink);
  EXPECT_EQ(t->token_to_id(test::byte_char(' ')), int32_t(' '));
  EXPECT_EQ(t->token_to_id("nope"), std::nullopt);
  EXPECT_EQ(t->vocab_size(), kEos + 1);
  EXPECT_EQ(t->eos_token(), "<eos>");
  EXPECT_EQ(t->bos_token(), "");
  EXPECT_EQ(t->eos_id(), kEos);
  EXPECT_EQ(t->stop_ids({7, kEos, 7, 9}), (std::vector<int32_t>{kEos, 7, 9}));
  EXPECT_EQ(t->markers().think_open, kThink);
  EXPECT_EQ(t->markers().think_close, std::nullopt);  // not in this vocab: looked up, not assumed
  auto no_cfg = make(base_json());
  EXPECT_EQ(no_cfg->eos_id(), std::nullopt);
  EXPECT_EQ(no_cfg->stop_ids({5}), (std::vector<int32_t>{5}));
  auto obj_cfg = make(base_json(), R"({"eos_token": {"content": "<a>", "special": true}})");
  EXPECT_EQ(obj_cfg->eos_id(), kA);
}

TEST(AddedTokens, UnsupportedComponentsFailNamingThem) {
  struct Case {
    const char* name;
    void (*edit)(nlohmann::json&);
  } cases[] = {
      {"Lowercase", [](nlohmann::json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }},
      {"Whitespace", [](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }},
      {"Unigram", [](nlohmann::json& j) { j["model"]["type"] = "Unigram"; }},
      {"WordPiece", [](nlohmann::json& j) { j["decoder"] = {{"type", "WordPiece"}}; }},
      {"add_prefix_space", [](nlohmann::json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; }},
      {"MergedWithNext", [](nlohmann::json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "MergedWithNext"}, {"invert", false}};
       }},
      {"truncation", [](nlohmann::json& j) { j["truncation"] = {{"max_length", 8}}; }},
  };
  for (const auto& c : cases) {
    auto j = base_json();
    c.edit(j);
    auto r = Tokenizer::from_json_text(j.dump(), "");
    ASSERT_FALSE(r.is_ok()) << c.name;
    EXPECT_NE(r.message().find(c.name), std::string::npos) << r.message();
  }
}

// An added token's id must be a JSON integer in [0, INT32_MAX]: anything else is an error naming the token, never
// a cast of a float or a huge value (tokenizer_json_fuzz found `"id": 1e300` read as an int, undefined behaviour).
TEST(AddedTokens, IdsThatAreNotSmallIntegersAreErrors) {
  const nlohmann::json ids[] = {1e300, -1e300, 1.5, -5, int64_t(1) << 40, uint64_t(1) << 63, "7", nullptr};
  for (const auto& id : ids) {
    auto j = base_json();
    j["added_tokens"][0]["id"] = id;
    auto r = Tokenizer::from_json_text(j.dump(), "");
    ASSERT_FALSE(r.is_ok()) << id.dump();
    EXPECT_NE(r.message().find("tokenizer.json"), std::string::npos) << id.dump() << ": " << r.message();
  }
}

}  // namespace
}  // namespace lily
