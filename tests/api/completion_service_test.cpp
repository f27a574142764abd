// CompletionService on a tiny synthetic checkpoint: model names, the context budget, the
// tool_choice forcing, and the reply-start snapshot position. Expected prompt pieces are the
// Qwen template's literal text (model-spec.md §1.7), not output of our code.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "../engine/tiny_checkpoint.h"
#include "server/completion_service.h"

namespace lily {
namespace {

using oj = nlohmann::ordered_json;

class ServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    load_tiny("service-test", 2, false, dir_, model_, tok_);
    if (::testing::Test::HasFatalFailure()) return;
    tmpl_ = new ChatTemplate(std::move(ChatTemplate::load_dir(dir_)).value());
    EngineOptions eo;
    eo.max_seq = 1024;
    engine_ = new Engine(*model_, *tok_, eo);
    ServiceOptions o;
    o.model_names = {"Qwen3.6-35B-A3B", "tiny"};
    svc_ = new CompletionService(*engine_, *tok_, tmpl_, o);
  }
  static void TearDownTestSuite() {
    delete svc_;
    delete engine_;
    delete tmpl_;
    unload_tiny(dir_, model_, tok_);
  }
  static ApiRequest chat(const char* body) {
    ApiRequest r;
    auto e = parse_chat_request(oj::parse(body), false, r);
    EXPECT_FALSE(e) << e->message;
    return r;
  }
  static std::string text(const std::vector<int32_t>& ids) { return tok_->decode(ids, false); }

  static inline std::string dir_;
  static inline Model* model_ = nullptr;
  static inline Tokenizer* tok_ = nullptr;
  static inline ChatTemplate* tmpl_ = nullptr;
  static inline Engine* engine_ = nullptr;
  static inline CompletionService* svc_ = nullptr;
};

TEST_F(ServiceTest, ModelNamesAndContextBudget) {
  PreparedRequest p;
  auto e = svc_->prepare(chat(R"({"model":"gpt-4","messages":[{"role":"user","content":"hi"}]})"), p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 404);
  EXPECT_EQ(e->code, "model_not_found");
  EXPECT_FALSE(svc_->prepare(chat(R"({"model":"tiny","messages":[{"role":"user","content":"hi"}]})"), p));
  EXPECT_EQ(p.model, "tiny");
  EXPECT_EQ(p.gen->max_tokens, 1024 - int(p.gen->prompt.size()));  // default: the rest of the context
  e = svc_->prepare(chat(R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":1020})"), p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "context_length_exceeded");
  e = svc_->prepare(chat(R"({"messages":[{"role":"system","content":"s"}]})"), p);
  ASSERT_TRUE(e);  // the template: no user query
  EXPECT_EQ(e->status, 400);
}

TEST_F(ServiceTest, NamedToolChoiceWritesTheOpening) {
  const char* tools = R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}],
                         "tool_choice":{"type":"function","function":{"name":"get_weather"}})";
  PreparedRequest p;
  std::string off = std::string(R"({"messages":[{"role":"user","content":"w?"}],"chat_template_kwargs":{"enable_thinking":false},)") + tools + "}";
  ASSERT_FALSE(svc_->prepare(chat(off.c_str()), p));
  EXPECT_FALSE(p.parser.in_reasoning);
  EXPECT_EQ(text(p.gen->forced_prefix), "<tool_call>\n<function=get_weather>\n");
  std::string on = std::string(R"({"messages":[{"role":"user","content":"w?"}],)") + tools + "}";
  ASSERT_FALSE(svc_->prepare(chat(on.c_str()), p));
  EXPECT_TRUE(p.parser.in_reasoning);
  EXPECT_TRUE(p.gen->forced_prefix.empty());
  EXPECT_EQ(p.gen->inject_after, tok_->token_to_id("</think>"));
  EXPECT_EQ(text(p.gen->inject_tokens), "\n\n<tool_call>\n<function=get_weather>\n");
}

TEST_F(ServiceTest, SnapshotAtTheStartOfTheReply) {
  PreparedRequest p;
  ASSERT_FALSE(svc_->prepare(chat(R"({"messages":[{"role":"user","content":"hi"}]})"), p));
  ASSERT_GT(p.gen->snapshot_at, 0);
  std::vector<int32_t> head(p.gen->prompt.begin(), p.gen->prompt.begin() + p.gen->snapshot_at);
  EXPECT_EQ(text(head), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_FALSE(svc_->prepare(chat(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}})"), p));
  EXPECT_EQ(p.gen->snapshot_at, -1);  // thinking off: the whole reply is reused instead
}

TEST_F(ServiceTest, SharedHeadEndsAfterTheSystemMessage) {
  PreparedRequest a, b;
  ASSERT_FALSE(svc_->prepare(chat(R"({"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"hi"}]})"), a));
  ASSERT_GT(a.gen->shared_prefix_at, 0);
  std::vector<int32_t> head(a.gen->prompt.begin(), a.gen->prompt.begin() + a.gen->shared_prefix_at);
  EXPECT_EQ(text(head), "<|im_start|>system\nYou are terse.<|im_end|>\n");
  // Another conversation with the same system prompt starts with the same tokens.
  ASSERT_FALSE(svc_->prepare(chat(R"({"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"bye now"}]})"), b));
  ASSERT_EQ(b.gen->shared_prefix_at, a.gen->shared_prefix_at);
  EXPECT_TRUE(std::equal(head.begin(), head.end(), b.gen->prompt.begin()));
  // Tool definitions render into the system block, which is then the shared head.
  const char* tools = R"({"messages":[{"role":"user","content":"w?"}],"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{}}}}]})";
  ASSERT_FALSE(svc_->prepare(chat(tools), a));
  ASSERT_GT(a.gen->shared_prefix_at, 0);
  const std::string t = text(std::vector<int32_t>(a.gen->prompt.begin(), a.gen->prompt.begin() + a.gen->shared_prefix_at));
  EXPECT_TRUE(t.starts_with("<|im_start|>system\n")) << t;
  EXPECT_TRUE(t.ends_with("<|im_end|>\n")) << t;
  EXPECT_NE(t.find("get_weather"), std::string::npos) << t;
  // No system message: no shared head.
  ASSERT_FALSE(svc_->prepare(chat(R"({"messages":[{"role":"user","content":"hi"}]})"), a));
  EXPECT_EQ(a.gen->shared_prefix_at, -1);
}

TEST_F(ServiceTest, HistoryRewriteKeepsTheEmptyThinkBlock) {
  ApiRequest r = chat(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},
                          {"role":"user","content":"c"}],"chat_template_kwargs":{"enable_thinking":false}})");
  auto prompt = svc_->render(r);
  ASSERT_TRUE(prompt) << prompt.message();
  EXPECT_EQ(prompt.value(),
            "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n"
            "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

}  // namespace
}  // namespace lily
