// Reasoning and tool-call parsing over streamed fragments: every test feeds the same reply
// whole, split at every byte position, and one byte at a time; all must give the expected
// result, written by hand from the Qwen template's format (not produced by our code).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/reply_parser.h"

namespace lily {
namespace {

using nlohmann::json;

struct Assembled {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

Assembled run(const ReplyParserOptions& o, const std::vector<std::string>& pieces) {
  ReplyParser p(o);
  ReplyDelta all;
  for (const auto& s : pieces) all.append(p.push(s));
  all.append(p.flush());
  return {all.reasoning(), all.content(), all.calls()};
}

// Every way of cutting `text` that the tests use: whole, one cut at each byte, byte by byte.
std::vector<std::vector<std::string>> splits(const std::string& text) {
  std::vector<std::vector<std::string>> out{{text}};
  for (size_t i = 1; i < text.size(); ++i) out.push_back({text.substr(0, i), text.substr(i)});
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  out.push_back(bytes);
  return out;
}

void expect_all_splits(const ReplyParserOptions& o, const std::string& text, const std::string& reasoning,
                       const std::string& content, std::vector<std::pair<std::string, json>> calls = {}) {
  for (const auto& pieces : splits(text)) {
    Assembled a = run(o, pieces);
    std::string where = pieces.size() == 2 ? "cut at " + std::to_string(pieces[0].size())
                                           : std::to_string(pieces.size()) + " pieces";
    ASSERT_EQ(a.reasoning, reasoning) << where;
    ASSERT_EQ(a.content, content) << where;
    ASSERT_EQ(a.calls.size(), calls.size()) << where;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(a.calls[i].name, calls[i].first) << where;
      EXPECT_EQ(json::parse(a.calls[i].arguments), calls[i].second) << where;
      EXPECT_EQ(a.calls[i].id.rfind("call_", 0), 0u);
    }
  }
}

ReplyParserOptions thinking() {
  ReplyParserOptions o;
  o.in_reasoning = true;
  return o;
}

TEST(ReasoningParser, TemplateOpenedThink) {
  expect_all_splits(thinking(), "\nLet me think.\nTwo lines.\n</think>\n\nThe answer is 4.",
                    "Let me think.\nTwo lines.", "The answer is 4.");
}

TEST(ReasoningParser, StopsInsideReasoning) {
  // finish_reason=length inside the think block: everything is reasoning, no content.
  expect_all_splits(thinking(), "\nStill thinking about </thi", "Still thinking about </thi", "");
}

TEST(ReasoningParser, ThinkingDisabledIsAllContent) {
  ReplyParserOptions o;  // prompt ended with "<think>\n\n</think>\n\n"
  expect_all_splits(o, "Hello <b>there</b>\n", "", "Hello <b>there</b>\n");
}

TEST(ReasoningParser, ModelOpensItsOwnThink) {
  ReplyParserOptions o;
  expect_all_splits(o, "<think>\nhmm\n</think>\n\nok", "hmm", "ok");
}

TEST(ReasoningParser, ThinkLaterInContentIsText) {
  ReplyParserOptions o;
  expect_all_splits(o, "Use <think> tags", "", "Use <think> tags");
}

TEST(ReasoningParser, EmptyThinkBlock) {
  expect_all_splits(thinking(), "\n\n</think>\n\nDone.", "", "Done.");
}

TEST(ReasoningParser, RawCompletionsAreContent) {
  ReplyParserOptions o;
  o.parse_reasoning = false;
  expect_all_splits(o, "<think>x</think>y", "", "<think>x</think>y");
}

nlohmann::ordered_json weather_tools() {
  return nlohmann::ordered_json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
    "properties":{"city":{"type":"string"},"days":{"type":"integer"},"metric":{"type":"boolean"},
    "ratio":{"type":"number"},"opts":{"type":"object"},"zip":{"type":"string"}}}}},
    {"type":"function","function":{"name":"now","parameters":{"type":"object","properties":{}}}}])");
}

ReplyParserOptions with_tools(bool in_reasoning) {
  ReplyParserOptions o;
  o.in_reasoning = in_reasoning;
  o.parse_tools = true;
  o.tools = weather_tools();
  return o;
}

TEST(ToolCallParser, OneCallAfterReasoning) {
  std::string text =
      "\nNeed weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=zip>\n01234\n</parameter>\n</function>\n</tool_call>";
  expect_all_splits(with_tools(true), text, "Need weather.", "",
                    {{"get_weather", json{{"city", "Paris"}, {"days", 3}, {"zip", "01234"}}}});
}

TEST(ToolCallParser, ContentThenTwoCallsTyped) {
  std::string text =
      "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=metric>\ntrue\n</parameter>\n"
      "<parameter=ratio>\n0.5\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n"
      "<parameter=city>\nNew\nYork\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=now>\n"
      "</function>\n</tool_call>";
  expect_all_splits(with_tools(false), text, "", "Checking.",
                    {{"get_weather", json{{"metric", true}, {"ratio", 0.5}, {"opts", {{"a", {1, 2}}}}, {"city", "New\nYork"}}},
                     {"now", json::object()}});
}

TEST(ToolCallParser, UnknownFunctionFallsBackToContent) {
  std::string text = "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>";
  expect_all_splits(with_tools(false), text, "", text);
}

TEST(ToolCallParser, NotACallFallsBackToContent) {
  for (std::string text : {"A <tool_call>hello</tool_call> B", "<tool_call>\n<function=get\nweather>x</tool_call>",
                           // a newline before the '>' (found by the reply_parser fuzz target)
                           "<tool_call>\n<function=now\n>\n</function>\n</tool_call>",
                           "x <tool_call>\n<parameter=city>\n1\n</parameter>\n</tool_call>"})
    expect_all_splits(with_tools(false), text, "", text);
  // Then a real call after the text.
  expect_all_splits(with_tools(false), "<tool_call>?</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
                    "", "<tool_call>?</tool_call>", {{"now", json::object()}});
}

// A known function starts a call at once (its arguments stream), so a malformed body can no
// longer become content: the call ends with the parameters it has.
TEST(ToolCallParser, MalformedKnownCallEndsWithWhatItHas) {
  std::string text = "A <tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call> B";
  expect_all_splits(with_tools(false), text, "", "A B", {{"get_weather", json{{"city", "Paris"}}}});
  text = "<tool_call>\n<function=get_weather>\njunk<parameter=days>\n2\n</parameter>\n</tool_call>";
  expect_all_splits(with_tools(false), text, "", "", {{"get_weather", json{{"days", 2}}}});
}

TEST(ToolCallParser, UnfinishedCallEndsWithWhatItHas) {
  std::string text = "Hi\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";
  expect_all_splits(with_tools(false), text, "", "Hi", {{"get_weather", json{{"city", "Par"}}}});
  expect_all_splits(with_tools(false), "<tool_call>\n<function=get_weather>\n<parameter=days>\n4", "", "",
                    {{"get_weather", json{{"days", 4}}}});
}

// Arguments go out as they are generated: a string value character by character, holding back
// only what may be its closing tag; other types when they close.
TEST(ToolCallParser, ArgumentsStreamAsGenerated) {
  ReplyParser p(with_tools(false));
  ReplyDelta d = p.push("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan J");
  ASSERT_EQ(d.items.size(), 1u);
  EXPECT_TRUE(d.items[0].begin);
  EXPECT_EQ(d.items[0].name, "get_weather");
  EXPECT_EQ(d.items[0].text, "{\"city\":\"San J");
  EXPECT_EQ(p.push("os\"e\n</par").items.at(0).text, "os\\\"e");
  EXPECT_EQ(p.push("ameter>\n<parameter=days>\n1").items.at(0).text, "\",\"days\":");
  EXPECT_TRUE(p.push("4").empty());
  ReplyDelta last = p.push("\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(last.items.size(), 1u);
  EXPECT_EQ(last.items[0].text, "14}");
  EXPECT_TRUE(last.items[0].end);
}

TEST(ToolCallParser, MissingCloseTagButCompleteFunction) {
  std::string text = "<tool_call>\n<function=get_weather>\n<parameter=days>\nx7\n</parameter>\n</function>\n";
  // "x7" is not an integer: kept as text rather than dropped.
  expect_all_splits(with_tools(false), text, "", "", {{"get_weather", json{{"days", "x7"}}}});
}

TEST(ToolCallParser, ToolsOffLeavesMarkupAsContent) {
  ReplyParserOptions o;
  std::string text = "<tool_call>\n<function=now>\n</function>\n</tool_call>";
  expect_all_splits(o, text, "", text);
}

TEST(ToolCallParser, CallInsideReasoningStaysReasoning) {
  std::string text = "\n<tool_call>x</tool_call>\n</think>\n\nok";
  expect_all_splits(with_tools(true), text, "<tool_call>x</tool_call>", "ok");
}

TEST(ToolCallParser, ParallelOffKeepsFirst) {
  auto o = with_tools(false);
  o.parallel_tool_calls = false;
  std::string one = "<tool_call>\n<function=now>\n</function>\n</tool_call>";
  expect_all_splits(o, one + "\n" + one, "", "", {{"now", json::object()}});
}

TEST(ToolCallParser, TypedValueSchemas) {
  using oj = nlohmann::ordered_json;
  EXPECT_EQ(typed_value("42", oj{{"type", "integer"}}), 42);
  EXPECT_EQ(typed_value("4.5", oj{{"type", "integer"}}), "4.5");
  EXPECT_EQ(typed_value("null", oj{{"type", oj::array({"string", "null"})}}), nullptr);
  EXPECT_EQ(typed_value("[1]", oj{{"anyOf", oj::array({oj{{"type", "array"}}, oj{{"type", "string"}}})}}),
            oj::array({1}));
  EXPECT_EQ(typed_value("42", oj()), "42");
}

}  // namespace
}  // namespace lily
