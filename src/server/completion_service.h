// From a validated ApiRequest to an engine request: model name check, chat template render
// (with the history rewrite that keeps turn N+1's prompt an exact extension of turn N), token
// budget, sampling defaults, tool_choice forcing, and the reply parser's settings. Shared by
// the HTTP server and `lily chat`.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/reply_parser.h"
#include "structured/vocab_index.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lily {

struct ServiceOptions {
  std::vector<std::string> model_names;  // accepted `model` values; the first is the main one
  bool test_hooks = false;
  SamplingParams defaults;               // from generation_config.json when present
  int default_max_tokens = 4096;         // when a request gives none (capped by the context); 0 = up to the context
};

struct PreparedRequest {
  std::shared_ptr<GenRequest> gen;  // choice 0; the others are gen->forks
  ReplyParserOptions parser;
  std::string prompt_text;
  std::string model;  // the name to echo back
};

class CompletionService {
 public:
  CompletionService(Engine& engine, const Tokenizer& tok, const ChatTemplate* tmpl, ServiceOptions opts);

  std::optional<ApiError> prepare(const ApiRequest& req, PreparedRequest& out) const;
  // The prompt a chat request renders to (exposed for tests and `lily chat`).
  Result<std::string> render(const ApiRequest& req) const;

  int reply_start(const std::vector<int32_t>& prompt) const;
  // Index just past the system message's "<|im_end|>\n" when the prompt opens with one (the
  // template puts tool definitions there too): the head shared by every request with the same
  // system prompt and tools. -1 otherwise.
  int shared_head_end(const std::vector<int32_t>& prompt) const;
  const ServiceOptions& options() const { return opts_; }
  Engine& engine() { return engine_; }
  const Tokenizer& tokenizer() const { return tok_; }
  const structured::VocabIndex& vocab() const { return *vocab_; }

 private:
  // The structured-output constraint a request asks for (none: null), or the 400.
  std::optional<ApiError> constraint(const ApiRequest& req, const ReplyParserOptions& po, GenRequest& gen) const;

  Engine& engine_;
  const Tokenizer& tok_;
  const ChatTemplate* tmpl_;
  ServiceOptions opts_;
  std::shared_ptr<const structured::VocabIndex> vocab_;  // token masks over the model's vocabulary
};

// Lily's history trick: with thinking off, the generation prompt ends "<think>\n\n</think>\n\n",
// but the template drops think blocks from assistant turns before the last user query, so the
// next turn would not extend this one. Writing the empty block into those turns' content (with
// an empty reasoning_content) keeps every earlier turn byte-identical across requests.
nlohmann::ordered_json rewrite_history_for_cache(const nlohmann::ordered_json& messages, bool thinking_enabled);

// Reads sampling defaults from dir/generation_config.json (temperature, top_p, top_k, ...).
SamplingParams load_sampling_defaults(const std::string& dir);

}  // namespace lily
