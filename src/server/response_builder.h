// Engine events → OpenAI response objects, streamed (chat.completion.chunk / text_completion
// chunks) or whole (chat.completion / text_completion). One builder per request; it runs the
// reply parser, so streamed and non-streamed replies are split the same way.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/openai_request.h"
#include "server/reply_parser.h"
#include "text/tokenizer.h"

namespace lily {

class ResponseBuilder {
 public:
  ResponseBuilder(const ApiRequest& req, const ReplyParserOptions& parser, std::string model,
                  const Tokenizer& tok);

  // Streaming: the chunks to send for this event (possibly none). The first call also yields
  // the role chunk; the done event yields the finish chunk and, if asked, the usage chunk.
  std::vector<nlohmann::json> on_event(const GenEvent& ev);
  // Non-streaming: feed every event with on_event (ignoring its chunks), then build.
  nlohmann::json whole() const;

  const std::string& id() const { return id_; }
  bool done() const { return done_; }
  FinishReason finish() const { return finish_; }
  const GenUsage& usage() const { return usage_; }
  std::string finish_reason() const;  // OpenAI's: stop | length | tool_calls

 private:
  nlohmann::json chunk(nlohmann::json delta_or_text, const nlohmann::json& finish) const;
  nlohmann::json usage_json() const;
  nlohmann::json logprob_entries(const std::vector<GenToken>& toks) const;  // chat format
  void add_completion_logprobs(const std::vector<GenToken>& toks);
  std::string token_text(int32_t id) const;

  const bool chat_;
  const bool stream_usage_;
  const bool logprobs_;
  std::string id_, model_;
  int64_t created_;
  const Tokenizer& tok_;
  ReplyParser parser_;
  bool started_ = false, done_ = false;
  FinishReason finish_ = FinishReason::kStop;
  GenUsage usage_;
  int reasoning_tokens_ = 0;
  // Accumulated reply (for whole()).
  std::string reasoning_, content_;
  std::vector<ToolCall> calls_;
  nlohmann::json logprobs_acc_;  // chat: array of entries; completions: the legacy object
};

// "data: {json}\n\n"
std::string sse_data(const nlohmann::json& j);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace lily
