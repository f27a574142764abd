// Chat template and Jinja interpreter vs jinja2 goldens (tools/make_template_goldens.py): every
// conversation through the qwen3.6 and Qwen3 templates must render byte-identically (or fail
// where jinja2 / the request conversion fails), and every interpreter unit case likewise.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "text/chat_prompt.h"
#include "text/chat_template.h"

namespace lily {
namespace {

using ojson = nlohmann::ordered_json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ojson load_golden(const std::string& name) {
  std::string path = std::string(LILY_SOURCE_DIR) + "/tests/data/templates/" + name;
  std::string text = read_text(path);
  EXPECT_FALSE(text.empty()) << "missing golden " << path;
  return ojson::parse(text);
}

// Compares one outcome with the golden's expectation; returns a description of the mismatch.
std::string check(const Result<std::string>& got, const ojson& expect) {
  if (expect.contains("output")) {
    if (!got.is_ok()) return "expected output, got error: " + got.message();
    if (got.value() != expect["output"].get<std::string>())
      return "output differs\n--- expected ---\n" + expect["output"].get<std::string>() + "\n--- got ---\n" + got.value();
    return "";
  }
  if (got.is_ok()) return "expected error (" + expect["message"].get<std::string>() + "), got output:\n" + got.value();
  // raise_exception messages and request-conversion messages must match exactly.
  bool exact = expect["raised"].get<bool>() || expect["error"] == "request";
  if (exact && got.message() != expect["message"].get<std::string>())
    return "error message differs: expected '" + expect["message"].get<std::string>() + "', got '" + got.message() + "'";
  return "";
}

void run_chat_goldens(const std::string& file) {
  ojson g = load_golden(file);
  ASSERT_TRUE(g.contains("cases"));
  std::string source = g.contains("template_path")
                           ? read_text(std::string(LILY_SOURCE_DIR) + "/" + g["template_path"].get<std::string>())
                           : g["template"].get<std::string>();
  auto tmpl = ChatTemplate::parse(source);
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.message();
  int n = 0;
  for (auto& c : g["cases"]) {
    ChatPromptOptions opts;
    opts.bos_token = c["options"].value("bos_token", "");
    opts.eos_token = c["options"].value("eos_token", "");
    if (c["options"].contains("enable_thinking") && !c["options"]["enable_thinking"].is_null())
      opts.enable_thinking = c["options"]["enable_thinking"].get<bool>();
    auto got = render_chat_prompt(tmpl.value(), c["request"], opts);
    const ojson& expect = c["expect"];
    if (c.contains("context")) {  // the conversion must give Python's context, key order included
      auto ctx = chat_template_context(c["request"], opts);
      EXPECT_TRUE(ctx.is_ok()) << c["name"] << ": " << ctx.message();
      if (ctx.is_ok()) {
        EXPECT_EQ(ctx.value().dump(), c["context"].dump()) << c["name"];
      }
    }
    std::string diff = check(got, expect);
    EXPECT_EQ(diff, "") << file << " case " << c["name"].get<std::string>();
    ++n;
  }
  EXPECT_GE(n, 40);
}

TEST(ChatTemplateGolden, Qwen36) { run_chat_goldens("qwen3.6_chat.json"); }
TEST(ChatTemplateGolden, Qwen3) { run_chat_goldens("qwen3_chat.json"); }

TEST(JinjaGolden, UnitCases) {
  ojson g = load_golden("jinja_unit.json");
  ASSERT_TRUE(g.contains("cases"));
  for (auto& c : g["cases"]) {
    std::string name = c["name"].get<std::string>();
    const ojson& expect = c["expect"];
    auto tmpl = ChatTemplate::parse(c["template"].get<std::string>());
    if (expect.value("error", "") == "load") {
      EXPECT_FALSE(tmpl.is_ok()) << name << ": jinja2 refused to load it: " << expect["message"];
      continue;
    }
    if (!tmpl.is_ok()) {
      ADD_FAILURE() << name << ": load failed: " << tmpl.message();
      continue;
    }
    auto got = tmpl.value().render(c["context"]);
    EXPECT_EQ(check(got, expect), "") << name;
  }
}

TEST(ChatTemplate, LoadErrorsNameTheLine) {
  auto t = ChatTemplate::parse("line one\n{% if x %}\n{{ y | nosuchfilter }}\n{% endif %}");
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.message().find("line 3"), std::string::npos) << t.message();
  auto u = ChatTemplate::parse("a\nb\n{% call foo() %}x{% endcall %}");
  ASSERT_FALSE(u.is_ok());
  EXPECT_NE(u.message().find("line 3"), std::string::npos) << u.message();
  EXPECT_NE(u.message().find("call"), std::string::npos) << u.message();
}

TEST(ChatTemplate, LoadDirPrefersJinjaFile) {
  std::string dir = ::testing::TempDir() + "/lily_chat_template_dir";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer_config.json") << R"({"chat_template": "cfg {{ x }}"})";
  auto from_cfg = ChatTemplate::load_dir(dir);
  ASSERT_TRUE(from_cfg.is_ok()) << from_cfg.message();
  EXPECT_EQ(from_cfg.value().render(ojson{{"x", 1}}).value(), "cfg 1");
  std::ofstream(dir + "/chat_template.jinja") << "file {{ x }}\n";
  auto from_file = ChatTemplate::load_dir(dir);
  ASSERT_TRUE(from_file.is_ok()) << from_file.message();
  EXPECT_EQ(from_file.value().render(ojson{{"x", 2}}).value(), "file 2");
  EXPECT_FALSE(ChatTemplate::load_dir(dir + "/nope").is_ok());
  // HF's named-template list: the "default" entry.
  std::string dir2 = dir + "_named";
  std::filesystem::remove_all(dir2);
  std::filesystem::create_directories(dir2);
  std::ofstream(dir2 + "/tokenizer_config.json")
      << R"({"chat_template": [{"name": "tool_use", "template": "t"}, {"name": "default", "template": "d{{ x }}"}]})";
  auto named = ChatTemplate::load_dir(dir2);
  ASSERT_TRUE(named.is_ok()) << named.message();
  EXPECT_EQ(named.value().render(ojson{{"x", 3}}).value(), "d3");
}

TEST(ChatPrompt, UnsortedJsonOverloadAgreesOnOrderFreeRequests) {
  auto tmpl = ChatTemplate::parse(read_text(std::string(LILY_SOURCE_DIR) + "/assets/qwen3.6-chat_template.jinja"));
  ASSERT_TRUE(tmpl.is_ok());
  nlohmann::json req = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  ChatPromptOptions opts;
  auto a = render_chat_prompt(tmpl.value(), req, opts);
  auto b = render_chat_prompt(tmpl.value(), ojson(req), opts);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  EXPECT_EQ(a.value(), b.value());
}

}  // namespace
}  // namespace lily
