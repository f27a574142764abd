// Engine events → OpenAI chat.completion(.chunk) and text_completion objects, for n choices.
// Streaming: per choice a role chunk, then reasoning_content / content / tool_calls deltas as the
// reply parser releases them (tool-call arguments piece by piece), then its finish chunk; after
// the last choice the usage chunk (stream_options.include_usage) and [DONE].
#pragma once
#include <string>
#include <vector>

#include "server/openai_request.h"
#include "server/reply_writer.h"
#include "text/tokenizer.h"

namespace lily {

class OpenAIWriter : public ReplyWriter {
 public:
  OpenAIWriter(const ApiRequest& req, const ReplyParserOptions& parser, std::string model, const Tokenizer& tok);

  std::vector<std::string> on_event(int choice, const GenEvent& ev) override;
  std::vector<std::string> end() override;
  nlohmann::json whole() override;
  const std::string& id() const override { return id_; }

 private:
  struct Choice {
    explicit Choice(const ReplyParserOptions& o) : parse(o) {}
    ChoiceParse parse;
    bool started = false;
    nlohmann::json logprobs;  // chat: array of entries; completions: the legacy object
  };
  nlohmann::json chunk(int index, nlohmann::json delta_or_text, const nlohmann::json& finish) const;
  nlohmann::json usage_json() const;
  nlohmann::json logprob_entries(const std::vector<GenToken>& toks) const;  // chat format
  nlohmann::json completion_logprobs(Choice& c, const std::vector<GenToken>& toks) const;  // this event's part
  std::string finish_reason(const Choice& c) const;  // stop | length | tool_calls
  std::string token_text(int32_t id) const;

  const bool chat_, stream_usage_, logprobs_;
  std::string id_, model_;
  int64_t created_;
  const Tokenizer& tok_;
  std::vector<Choice> choices_;
};

}  // namespace lily
