// `lily generate`: greedy generation from prompt ids (or text, with the checkpoint's
// tokenizer), optionally with top-k logprobs, as JSON for comparison with transformers.
#include <chrono>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli/command.h"
#include "cli/model_args.h"
#include "model/logits.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace lily::cli {
namespace {

struct GenerateArgs {
  ModelArgs m;
  std::string prompt_ids, prompt;
  int max_tokens = 16, top_logprobs = 0, max_seq = 0;
  bool json = false, ignore_eos = false;
};

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument("range");
      ids.push_back(int32_t(v));
    } catch (const std::exception&) {
      return errorf("--prompt-ids: '{}' is not a token id", item);
    }
  }
  if (ids.empty()) return errorf("--prompt-ids: no ids given");
  return ids;
}

int run_generate(const GenerateArgs& a) {
  if (a.prompt_ids.empty() == a.prompt.empty()) {
    fmt::print(stderr, "error: give exactly one of --prompt-ids or --prompt\n");
    return 2;
  }
  const auto model = load_model(a.m, !a.json);
  if (!model) return 1;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> prompt;
  if (!a.prompt.empty()) {
    auto t = Tokenizer::load_dir(a.m.dir);
    if (!t) {
      fmt::print(stderr, "error: --prompt needs the checkpoint's tokenizer: {}\n", t.message());
      return 1;
    }
    tok = std::move(t).value();
    prompt = tok->encode(a.prompt);
  } else {
    auto ids = parse_ids(a.prompt_ids);
    if (!ids) {
      fmt::print(stderr, "error: {}\n", ids.message());
      return 2;
    }
    prompt = ids.value();
  }
  const ModelConfig& cfg = model->config();
  const int max_seq = a.max_seq > 0 ? a.max_seq : int(prompt.size()) + a.max_tokens + 1;
  auto state = model->new_state(max_seq);
  if (!state) {
    fmt::print(stderr, "error: {}\n", state.message());
    return 1;
  }
  std::vector<float> logits(cfg.vocab_size);
  nlohmann::json tops = nlohmann::json::array();
  std::vector<int32_t> out;
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  Status st = model->forward(**state, prompt, logits);
  auto t1 = clock::now();
  for (int i = 0; st.is_ok() && i < a.max_tokens; ++i) {
    int32_t next = argmax(logits);
    out.push_back(next);
    if (a.top_logprobs > 0) {
      nlohmann::json row = nlohmann::json::array();
      for (auto& [id, lp] : top_logprobs(logits, a.top_logprobs)) row.push_back({id, lp});
      tops.push_back(row);
    }
    bool eos = std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), next) != cfg.eos_token_ids.end();
    if ((eos && !a.ignore_eos) || i + 1 == a.max_tokens) break;
    st = model->forward(**state, std::span<const int32_t>(&next, 1), logits);
  }
  auto t2 = clock::now();
  if (!st) {
    fmt::print(stderr, "error: {}\n", st.message());
    return 1;
  }
  const double pf = std::chrono::duration<double>(t1 - t0).count();
  const double dc = std::chrono::duration<double>(t2 - t1).count();
  if (a.json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt;
    j["tokens"] = out;
    j["top_logprobs"] = tops;
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("tokens: {}\n", nlohmann::json(out).dump());
    if (tok) fmt::print("text: {}\n", tok->decode(out, true));
  }
  fmt::print(stderr, "prefill {} tokens in {:.3f} s ({:.1f} tok/s); decode {} tokens in {:.3f} s ({:.1f} tok/s) [{}]\n",
             prompt.size(), pf, prompt.size() / pf, out.size() > 0 ? out.size() - 1 : 0, dc,
             out.size() > 1 ? (out.size() - 1) / dc : 0.0, model->backend_name());
  return 0;
}

Registrar reg("generate", "Greedy generation from prompt ids or text", [](CLI::App& app) -> RunFn {
  auto a = std::make_shared<GenerateArgs>();
  add_model_option(app, a->m);
  app.add_option("--prompt-ids", a->prompt_ids, "Comma-separated prompt token ids");
  app.add_option("--prompt", a->prompt, "Prompt text (uses the checkpoint's tokenizer)");
  app.add_option("--max-tokens", a->max_tokens, "Tokens to generate")->check(CLI::PositiveNumber);
  app.add_option("--top-logprobs", a->top_logprobs, "Top-k logprobs per generated token")->check(CLI::NonNegativeNumber);
  add_backend_option(app, a->m, "cpu or cuda");
  add_threads_option(app, a->m);
  app.add_option("--max-seq", a->max_seq, "State capacity (default: prompt + max-tokens + 1)");
  app.add_flag("--json", a->json, "Print one JSON object");
  app.add_flag("--ignore-eos", a->ignore_eos, "Do not stop at the end-of-sequence ids");
  return [a] { return run_generate(*a); };
});

}  // namespace
}  // namespace lily::cli
