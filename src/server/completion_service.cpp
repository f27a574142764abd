// CompletionService: see completion_service.h.
#include "server/completion_service.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "structured/constraint.h"
#include "structured/output_grammar.h"
#include "text/chat_prompt.h"

namespace lily {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

CompletionService::CompletionService(Engine& engine, const Tokenizer& tok, const ChatTemplate* tmpl,
                                     ServiceOptions opts)
    : engine_(engine),
      tok_(tok),
      tmpl_(tmpl),
      opts_(std::move(opts)),
      vocab_(std::make_shared<structured::VocabIndex>(tok, engine.vocab_size())) {}

ojson rewrite_history_for_cache(const ojson& messages, bool thinking_enabled) {
  if (thinking_enabled) return messages;
  int last_user = -1;
  for (int i = 0; i < int(messages.size()); ++i)
    if (messages[i]["role"] == "user") last_user = i;
  ojson out = messages;
  for (int i = 0; i < last_user; ++i) {
    ojson& m = out[i];
    if (m["role"] != "assistant") continue;
    if (m.contains("reasoning_content") && m["reasoning_content"].is_string() &&
        !m["reasoning_content"].get<std::string>().empty())
      continue;  // real reasoning: leave it to the template
    std::string content;
    if (m.contains("content") && m["content"].is_string()) {
      content = m["content"];
    } else if (m.contains("content") && m["content"].is_array()) {
      for (const auto& p : m["content"]) content += p.value("text", "");
    }
    if (content.find("</think>") != std::string::npos) continue;  // already carries its block
    m["content"] = "<think>\n\n</think>\n\n" + content;
    m["reasoning_content"] = "";
  }
  return out;
}

Result<std::string> CompletionService::render(const ApiRequest& req) const {
  if (!tmpl_) return errorf("this checkpoint has no chat template");
  const bool thinking = req.enable_thinking.value_or(true);
  ojson body = ojson::object();
  body["messages"] = rewrite_history_for_cache(req.messages, thinking);
  if (req.tools.is_array()) body["tools"] = req.tools;
  ojson kwargs = req.template_kwargs;
  if (!kwargs.is_object()) kwargs = ojson::object();
  body["chat_template_kwargs"] = kwargs;
  ChatPromptOptions o;
  o.bos_token = tok_.bos_token();
  o.eos_token = tok_.eos_token();
  o.enable_thinking = req.enable_thinking;
  return render_chat_prompt(*tmpl_, body, o);
}

// Index just past the last "<|im_start|>…\n" of the prompt: where this turn's reply starts
// when the next turn renders it (-1 when not found or at the very end).
int CompletionService::reply_start(const std::vector<int32_t>& prompt) const {
  auto im_start = tok_.token_to_id("<|im_start|>");
  if (!im_start) return -1;
  int i = int(prompt.size()) - 1;
  while (i >= 0 && prompt[i] != *im_start) --i;
  if (i < 0) return -1;
  for (int j = i + 1; j < int(prompt.size()) - 1; ++j)
    if (tok_.decode(std::span<const int32_t>(&prompt[j], 1), false).find('\n') != std::string::npos) return j + 1;
  return -1;
}

int CompletionService::shared_head_end(const std::vector<int32_t>& prompt) const {
  auto im_start = tok_.token_to_id("<|im_start|>"), im_end = tok_.token_to_id("<|im_end|>");
  if (!im_start || !im_end || prompt.size() < 3 || prompt[0] != *im_start) return -1;
  const auto e = std::find(prompt.begin(), prompt.end(), *im_end);
  if (e == prompt.end()) return -1;
  int end = int(e - prompt.begin()) + 1;
  const int role_len = std::min(end - 1, 3);
  if (!tok_.decode(std::span<const int32_t>(&prompt[1], size_t(role_len)), false).starts_with("system")) return -1;
  if (end < int(prompt.size()) && tok_.decode(std::span<const int32_t>(&prompt[size_t(end)], 1), false) == "\n") ++end;
  return end < int(prompt.size()) ? end : -1;
}

static bool ends_inside_think(const std::string& prompt) {
  size_t end = prompt.size();
  while (end > 0 && (prompt[end - 1] == '\n' || prompt[end - 1] == ' ')) --end;
  return std::string_view(prompt).substr(0, end).ends_with("<think>");
}

std::optional<ApiError> CompletionService::prepare(const ApiRequest& req, PreparedRequest& out) const {
  // Model name.
  out.model = opts_.model_names.empty() ? "" : opts_.model_names[0];
  if (!req.model.empty()) {
    bool known = false;
    for (const auto& n : opts_.model_names) known = known || n == req.model;
    if (!known)
      return ApiError{404, fmt::format("The model '{}' does not exist; this server serves '{}'", req.model, out.model),
                      "invalid_request_error", "model", "model_not_found"};
    out.model = req.model;
  }
  // Choices: each takes a batch slot.
  if (req.n > engine_.options().max_batch)
    return ApiError::bad_request(fmt::format("'n' is {}, but this server decodes at most {} sequences together (--parallel)",
                                             req.n, engine_.options().max_batch),
                                 "n");
  // Prompt.
  if (req.chat) {
    auto p = render(req);
    if (!p) return ApiError::bad_request(p.message(), "messages");
    out.prompt_text = std::move(p).value();
  } else {
    out.prompt_text = req.prompt;
  }
  auto gen = std::make_shared<GenRequest>();
  gen->prompt = tok_.encode(out.prompt_text);
  if (gen->prompt.empty()) return ApiError::bad_request("the prompt encodes to no tokens", req.chat ? "messages" : "prompt");
  const int vocab = engine_.vocab_size();
  for (int32_t id : gen->prompt)
    if (id < 0 || id >= vocab) return ApiError::internal();  // tokenizer and model disagree
  // Token budget: prompt + completion must fit the context.
  const int max_seq = engine_.options().max_seq;
  const int n_prompt = int(gen->prompt.size());
  int max_tokens = req.max_tokens.value_or(opts_.default_max_tokens > 0 ? opts_.default_max_tokens : max_seq - n_prompt);
  if (!req.max_tokens) max_tokens = std::min(max_tokens, max_seq - n_prompt);
  if (n_prompt + max_tokens > max_seq || max_tokens < 1) {
    return ApiError{400,
                    fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                "({} in the {}, {} in the completion). Please reduce the length of the {} or completion.",
                                max_seq, n_prompt + std::max(max_tokens, 1), n_prompt, req.chat ? "messages" : "prompt",
                                std::max(max_tokens, 1), req.chat ? "messages" : "prompt"),
                    "invalid_request_error", req.chat ? "messages" : "prompt", "context_length_exceeded"};
  }
  gen->max_tokens = max_tokens;
  // Sampling: request values over the checkpoint's defaults.
  SamplingParams s = opts_.defaults;
  if (req.temperature) s.temperature = *req.temperature;
  if (req.top_p) s.top_p = *req.top_p;
  if (req.top_k) s.top_k = std::max(0, *req.top_k);
  if (req.min_p) s.min_p = *req.min_p;
  if (req.presence_penalty) s.presence_penalty = *req.presence_penalty;
  if (req.frequency_penalty) s.frequency_penalty = *req.frequency_penalty;
  if (req.repetition_penalty) s.repetition_penalty = *req.repetition_penalty;
  s.seed = req.seed;
  s.top_logprobs = req.logprobs ? req.top_logprobs : -1;
  gen->sampling = s;
  gen->stop = req.stop;
  gen->cache_key = req.cache_key;
  gen->step_delay_ms = req.step_delay_ms;
  if (req.forced_output) {
    gen->forced_output = tok_.encode(*req.forced_output);
    if (gen->forced_output.empty()) return ApiError::bad_request("lily_forced_output encodes to no tokens", "lily_forced_output");
  }
  // Reply parsing.
  ReplyParserOptions& po = out.parser;
  po.parse_reasoning = req.chat;
  po.in_reasoning = req.chat && ends_inside_think(out.prompt_text);
  po.parse_tools = req.chat && req.tools.is_array() && req.tool_choice != "none";
  po.tools = req.tools;
  po.parallel_tool_calls = req.parallel_tool_calls;
  po.id_seed = req.seed ? *req.seed ^ 0x9e3779b97f4a7c15ull : std::random_device{}();
  // tool_choice required / named: the model cannot be trusted to call, so the call's opening is
  // written for it, right away or, when it is thinking, just after it closes the think block.
  if (po.parse_tools && (req.tool_choice == "required" || req.tool_choice == "function")) {
    std::string opening = "<tool_call>\n<function=";
    if (req.tool_choice == "function") opening += req.tool_choice_name + ">\n";
    auto close = tok_.markers().think_close;
    if (po.in_reasoning && close) {
      gen->inject_after = *close;
      gen->inject_tokens = tok_.encode("\n\n" + opening);
    } else if (!po.in_reasoning) {
      gen->forced_prefix = tok_.encode(opening);
    }
  }
  if (po.in_reasoning) gen->snapshot_at = reply_start(gen->prompt);
  gen->shared_prefix_at = shared_head_end(gen->prompt);
  if (auto e = constraint(req, po, *gen)) return e;
  // n > 1: the other choices share the prompt (and its prefill) and differ by their seed.
  for (int i = 1; i < req.n; ++i) {
    auto f = std::make_shared<GenRequest>();
    f->prompt = gen->prompt;
    f->max_tokens = gen->max_tokens;
    f->sampling = gen->sampling;
    if (f->sampling.seed) *f->sampling.seed += uint64_t(i);
    f->stop = gen->stop;
    f->forced_prefix = gen->forced_prefix;
    f->inject_after = gen->inject_after;
    f->inject_tokens = gen->inject_tokens;
    f->forced_output = gen->forced_output;
    f->step_delay_ms = gen->step_delay_ms;
    f->cache_key = gen->cache_key;
    if (gen->constraint) f->constraint = gen->constraint->fresh();
    gen->forks.push_back(std::move(f));
  }
  out.gen = std::move(gen);
  return std::nullopt;
}

std::optional<ApiError> CompletionService::constraint(const ApiRequest& req, const ReplyParserOptions& po,
                                                      GenRequest& gen) const {
  using structured::OutputSpec;
  OutputSpec os;
  os.json = req.format != ApiRequest::Format::kText;
  if (req.format == ApiRequest::Format::kJsonSchema) os.schema = &req.format_schema;
  // Tools whose arguments follow their schema: strict ones (all of them when any is, the others
  // as free text), or for tool_choice required/named the chosen ones.
  bool any_strict = false;
  std::vector<structured::ToolGrammar> tools;
  if (po.parse_tools)
    for (const auto& t : req.tools) {
      const auto& f = t["function"];
      const std::string name = f["name"];
      if (req.tool_choice == "function" && name != req.tool_choice_name) continue;
      const bool strict = f.contains("strict") && f["strict"].is_boolean() ? f["strict"].get<bool>() : req.strict_default;
      any_strict = any_strict || strict;
      tools.push_back({name, f.contains("parameters") ? &f["parameters"] : nullptr, strict});
    }
  const bool forced_call = po.parse_tools && (req.tool_choice == "required" || req.tool_choice == "function");
  if (any_strict) {
    if (forced_call) os.json = false;  // the reply is the call
    os.tools = tools;
    os.parallel_calls = req.parallel_tool_calls;
  }
  const bool triggered = any_strict && !os.json && !forced_call;  // tool_choice auto: from each <tool_call>
  if (!os.json && os.tools.empty() && !req.think_budget) return std::nullopt;
  auto spec = std::make_shared<structured::ConstraintSpec>();
  spec->vocab = vocab_;
  spec->allowed = vocab_->plain();
  spec->stop_ids = engine_.stop_ids();
  spec->in_think = po.in_reasoning;
  spec->think_close = tok_.markers().think_close;
  spec->think_budget = req.think_budget.value_or(-1);
  if (os.json || !os.tools.empty()) {
    os.prefix = po.in_reasoning ? "\n\n" : "";
    os.after_trigger = triggered;
    auto g = structured::output_grammar(os);
    const std::string param = os.tools.empty() ? req.format_param : "tools";
    if (!g) return ApiError::bad_request(g.message(), param, "unsupported_schema");
    spec->grammar = std::move(g).value();
    if (!os.tools.empty())  // the call markers are single tokens the model writes
      for (const auto& m : {tok_.markers().tool_call_open, tok_.markers().tool_call_close})
        if (m && *m < vocab_->n_vocab()) spec->allowed[size_t(*m) / 64] |= uint64_t(1) << (*m % 64);
    if (triggered) {
      if (!tok_.markers().tool_call_open) return std::nullopt;  // no <tool_call> token: nothing to trigger on
      spec->trigger = tok_.markers().tool_call_open;
    }
  }
  if (spec->in_think && !spec->think_close) spec->in_think = false;
  // The guarantee (complete output) needs max_tokens >= the shortest output counted a byte per
  // token; below that the output follows the grammar and may be cut by length.
  if (spec->grammar && !triggered) {
    const int64_t need = structured::GrammarConstraint(spec).reserve() - (spec->in_think ? 0 : 1);
    spec->budget = gen.max_tokens >= need;
  }
  auto c = std::make_unique<structured::GrammarConstraint>(spec);
  gen.constraint = std::move(c);
  return std::nullopt;
}

SamplingParams load_sampling_defaults(const std::string& dir) {
  SamplingParams s;
  std::ifstream f(std::filesystem::path(dir) / "generation_config.json");
  if (!f) return s;
  std::stringstream ss;
  ss << f.rdbuf();
  json g = json::parse(ss.str(), nullptr, false);
  if (!g.is_object()) return s;
  if (g.value("do_sample", true) == false) s.temperature = 0;
  if (g.contains("temperature") && g["temperature"].is_number()) s.temperature = g["temperature"];
  if (g.contains("top_p") && g["top_p"].is_number()) s.top_p = g["top_p"];
  if (g.contains("top_k") && g["top_k"].is_number_integer()) s.top_k = std::max(0, g["top_k"].get<int>());
  if (g.contains("min_p") && g["min_p"].is_number()) s.min_p = g["min_p"];
  if (g.contains("repetition_penalty") && g["repetition_penalty"].is_number())
    s.repetition_penalty = g["repetition_penalty"];
  return s;
}

}  // namespace lily
