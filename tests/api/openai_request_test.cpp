// Request validation: each malformed field is a 400 naming that field; unknown fields pass;
// test hooks are refused unless enabled. Expected statuses follow OpenAI's documented API.
#include <gtest/gtest.h>

#include "server/openai_request.h"

namespace lily {
namespace {

using oj = nlohmann::ordered_json;

oj base() { return oj::parse(R"({"model":"m","messages":[{"role":"user","content":"hi"}]})"); }

std::optional<ApiError> chat(const oj& body, bool hooks = false) {
  ApiRequest r;
  return parse_chat_request(body, hooks, r);
}

TEST(OpenAIRequest, AcceptsTheFullFieldSet) {
  oj b = base();
  b.update(oj::parse(R"({"max_completion_tokens":5,"temperature":0.5,"top_p":0.9,"top_k":20,"min_p":0.05,"seed":-3,
    "presence_penalty":1,"frequency_penalty":-1,"repetition_penalty":1.1,"stop":["a","b"],"n":1,"logprobs":true,
    "top_logprobs":5,"stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function",
    "function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"f"}},
    "parallel_tool_calls":false,"chat_template_kwargs":{"enable_thinking":false},"user":"u","metadata":{"a":"b"},
    "prompt_cache_key":"k","response_format":{"type":"text"},"future_field":[1,2,3]})"));
  b["messages"].push_back(oj::parse(R"({"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function",
    "function":{"name":"f","arguments":"{}"}}]})"));
  b["messages"].push_back(oj::parse(R"({"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"ok"}]})"));
  b["messages"].push_back(oj::parse(R"({"role":"developer","content":"be brief"})"));
  ApiRequest r;
  auto e = parse_chat_request(b, false, r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(*r.max_tokens, 5);
  EXPECT_EQ(r.stop.size(), 2u);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.tool_choice_name, "f");
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));
  EXPECT_EQ(r.messages[3]["role"], "system");  // developer → system for the template
  EXPECT_EQ(r.top_logprobs, 5);
}

TEST(OpenAIRequest, RejectsWithTheFieldNamed) {
  struct Case {
    const char* patch;
    const char* param;
  };
  for (const Case& c : std::initializer_list<Case>{
           {R"({"temperature":"hot"})", "temperature"},
           {R"({"temperature":3})", "temperature"},
           {R"({"max_tokens":0})", "max_tokens"},
           {R"({"max_tokens":1.5})", "max_tokens"},
           {R"({"n":9})", "n"},
           {R"({"n":0})", "n"},
           {R"({"logit_bias":{"50256":-100}})", "logit_bias"},
           {R"({"best_of":2})", "best_of"},
           {R"({"functions":[]})", "functions"},
           {R"({"modalities":["text","audio"]})", "modalities"},
           {R"({"reasoning_effort":"extreme"})", "reasoning_effort"},
           {R"({"response_format":{"type":"json_schema"}})", "response_format.json_schema"},
           {R"({"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})", "response_format.json_schema.schema"},
           {R"({"response_format":{"type":"xml"}})", "response_format.type"},
           {R"({"stop":[1]})", "stop"},
           {R"({"stream":"yes"})", "stream"},
           {R"({"top_logprobs":3})", "top_logprobs"},
           {R"({"logprobs":true,"top_logprobs":21})", "top_logprobs"},
           {R"({"response_format":"json"})", "response_format"},
           {R"({"tools":{"a":1}})", "tools"},
           {R"({"tool_choice":"sometimes"})", "tool_choice"},
           {R"({"tool_choice":"required"})", "tool_choice"},
           {R"({"messages":[]})", "messages"},
           {R"({"messages":"hi"})", "messages"},
           {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
           {R"({"messages":[{"content":"x"}]})", "messages[0].role"},
           {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content"},
           {R"({"messages":[{"role":"user"}]})", "messages[0].content"},
           {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
            "messages[0].content"},
           {R"({"lily_forced_output":"x"})", "lily_forced_output"},
           {R"({"chat_template_kwargs":{"enable_thinking":"no"}})", "chat_template_kwargs.enable_thinking"},
       }) {
    oj b = base();
    b.update(oj::parse(c.patch));
    auto e = chat(b);
    ASSERT_TRUE(e) << c.patch;
    EXPECT_EQ(e->status, 400) << c.patch;
    EXPECT_EQ(e->param, c.param) << c.patch;
    EXPECT_EQ(e->to_json()["error"]["type"], "invalid_request_error");
  }
  EXPECT_TRUE(chat(oj::array()));
  oj hooked = base();
  hooked["lily_forced_output"] = "x";
  EXPECT_FALSE(chat(hooked, true));
}

TEST(OpenAIRequest, StructuredOutputsAndChoices) {
  oj b = base();
  b.update(oj::parse(R"({"n":3,"response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,
    "schema":{"type":"object","properties":{"a":{"type":"integer"}}}}},"logit_bias":{},"reasoning_effort":"minimal"})"));
  ApiRequest r;
  ASSERT_FALSE(parse_chat_request(b, false, r));
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.format, ApiRequest::Format::kJsonSchema);
  EXPECT_EQ(r.format_name, "p");
  EXPECT_EQ(r.format_schema["properties"]["a"]["type"], "integer");
  EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));
  b["response_format"] = oj::parse(R"({"type":"json_object"})");
  ASSERT_FALSE(parse_chat_request(b, false, r));
  EXPECT_EQ(r.format, ApiRequest::Format::kJsonObject);
}

TEST(OpenAIRequest, Completions) {
  ApiRequest r;
  EXPECT_FALSE(parse_completion_request(oj::parse(R"({"prompt":"abc","logprobs":2})"), false, r));
  EXPECT_EQ(r.prompt, "abc");
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_TRUE(parse_completion_request(oj::parse(R"({"prompt":["a","b"]})"), false, r));
  EXPECT_TRUE(parse_completion_request(oj::parse(R"({"prompt":""})"), false, r));
}

TEST(OpenAIRequest, Utf8Validation) {
  EXPECT_TRUE(valid_utf8("plain \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(valid_utf8("\xff"));
  EXPECT_FALSE(valid_utf8("\xc3"));              // truncated
  EXPECT_FALSE(valid_utf8("\xc0\xaf"));          // overlong
  EXPECT_FALSE(valid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(valid_utf8("\xf4\x90\x80\x80"));  // past U+10FFFF
}

}  // namespace
}  // namespace lily
