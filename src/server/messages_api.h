// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on top of the chat
// service. system, messages with text / tool_use / tool_result / thinking blocks, tools and
// tool_choice (auto, any = required, tool = named, none), stop_sequences, and thinking: absent or
// disabled means off (as in Anthropic's API), enabled turns the template's thinking on and, with
// budget_tokens, ends the think block with </think> once that many tokens are spent. Replies are
// content blocks (thinking, text, tool_use) streamed as message_start, content_block_start /
// _delta (thinking_delta, text_delta, input_json_delta) / _stop, message_delta, message_stop.
// Errors have Anthropic's shape: {"type":"error","error":{"type","message"}}.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"
#include "server/reply_writer.h"

namespace lily {

// The request body → ApiRequest (chat). count_only: /v1/messages/count_tokens (no max_tokens).
std::optional<ApiError> parse_messages_request(const nlohmann::ordered_json& body, bool test_hooks, bool count_only,
                                               ApiRequest& out);

// Anthropic's error object for an ApiError (the type follows the status).
nlohmann::json anthropic_error(const ApiError& e);

class MessagesWriter : public ReplyWriter {
 public:
  MessagesWriter(const ReplyParserOptions& parser, std::string model);
  std::vector<std::string> begin() override;
  std::vector<std::string> on_event(int choice, const GenEvent& ev) override;
  std::vector<std::string> end() override;
  nlohmann::json whole() override;
  nlohmann::json error_body(const ApiError& e) const override { return anthropic_error(e); }
  std::string error_frame(const ApiError& e) const override;
  const std::string& id() const override { return id_; }

 private:
  enum class Block { kNone, kThinking, kText, kTool };
  nlohmann::json usage_json() const;
  std::string stop_reason() const;
  void close_block(std::vector<std::string>& out);

  std::string id_, model_;
  ChoiceParse parse_;
  Block open_ = Block::kNone;
  int index_ = -1;             // index of the open content block
  std::vector<std::string> final_;
};

}  // namespace lily
