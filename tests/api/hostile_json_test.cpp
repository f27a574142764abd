// Regression tests for deeply nested JSON (issue 8). nlohmann::json parses iteratively but
// copies, dumps and renders recursively: a body of a few hundred KB of '[' overflowed the stack
// (found by probing openai_request_fuzz / chat_template_fuzz / safetensors_fuzz / config_fuzz with
// long inputs). Every reader of outside JSON now refuses nesting past its format's needs.
// The committed corpus holds the same shapes just past each limit (tests/fuzz/corpus/*/regress-deep-*).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/json_depth.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "server/openai_request.h"
#include "server/tool_call_parser.h"
#include "text/chat_prompt.h"
#include "text/tokenizer.h"

namespace lily {
namespace {

constexpr size_t kDeep = 500000;  // far past any stack: the crash needed ~10^5

std::string nest(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(JsonDepth, CountsOnlyBracketsOutsideStrings) {
  EXPECT_EQ(json_nesting_depth("1"), 0u);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}]})"), 4u);
  EXPECT_EQ(json_nesting_depth(R"(["[[[[", "\"[[", {}])"), 2u);
  EXPECT_EQ(json_nesting_depth(nest(70)), 70u);
}

TEST(HostileJson, DeepRequestBodyIsA400) {
  std::string body = R"({"messages":[{"role":"user","content":"hi","x":)" + nest(kDeep) + "}]}";
  nlohmann::ordered_json out;
  auto e = parse_request_body(body, out);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_NE(e->message.find("nests deeper than 64 levels"), std::string::npos) << e->message;
  // At the limit it parses.
  std::string ok = R"({"messages":[{"role":"user","content":"hi","x":)" + nest(kMaxRequestDepth - 3) + "}]}";
  EXPECT_FALSE(parse_request_body(ok, out)) << "a body exactly at the limit was refused";
}

TEST(HostileJson, DeepToolCallArgumentsStringIsAnError) {
  // Arguments are JSON inside a JSON string: the body's depth check cannot see them.
  nlohmann::ordered_json req = nlohmann::ordered_json::parse(R"({"messages":[{"role":"user","content":"q"},
    {"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":""}}]}]})");
  req["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{\"a\":" + nest(kDeep) + "}";
  auto ctx = chat_template_context(req, {});
  ASSERT_FALSE(ctx.is_ok());
  EXPECT_NE(ctx.message().find("messages[1].tool_calls[0].function.arguments nests deeper than 64 levels"),
            std::string::npos)
      << ctx.message();
}

TEST(HostileJson, DeepToolCallParameterStaysText) {
  // A model reply with a deeply nested "object" parameter: kept as the raw text, not parsed.
  nlohmann::ordered_json schema = {{"type", "array"}};
  std::string raw = nest(kDeep);
  EXPECT_EQ(typed_value(raw, schema), nlohmann::ordered_json(raw));
  EXPECT_EQ(typed_value("[[1]]", schema), nlohmann::ordered_json::parse("[[1]]"));
}

TEST(HostileJson, DeepConfigIsAnError) {
  auto r = parse_config_json(R"({"model_type":"qwen3_5_moe","text_config":)" + nest(kDeep) + "}", "config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("config.json: nests deeper than 32 levels"), std::string::npos) << r.message();
}

TEST(HostileJson, DeepTokenizerJsonIsAnError) {
  auto r = Tokenizer::from_json_text(R"({"model":)" + nest(kDeep) + "}", "");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("nests deeper than 64 levels"), std::string::npos) << r.message();
}

TEST(HostileJson, DeepSafetensorsHeaderIsAnError) {
  std::string header = R"({"t":)" + nest(kDeep) + "}";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[size_t(i)] = char((uint64_t(header.size()) >> (8 * i)) & 0xff);
  file += header;
  auto path = std::filesystem::temp_directory_path() / ("lily-deep-" + std::to_string(::getpid()) + ".safetensors");
  std::ofstream(path, std::ios::binary) << file;
  auto r = SafeTensors::open_file(path.string());
  std::filesystem::remove(path);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("the header nests deeper than 16 levels"), std::string::npos) << r.message();
}

}  // namespace
}  // namespace lily
