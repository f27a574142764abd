// `lily render --model DIR [--no-thinking]`: stdin an OpenAI chat-completions request body, stdout
// the prompt the chat template renders for it (bos/eos tokens from DIR/tokenizer_config.json).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "text/chat_prompt.h"

namespace lily::cli {
namespace {

struct RenderArgs {
  std::string model;
  bool no_thinking = false;
};

// tokenizer_config.json's bos_token / eos_token: a string, or an AddedToken object's "content".
std::string special_token(const nlohmann::json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  return "";
}

int run_render(const RenderArgs& a) {
  auto tmpl = ChatTemplate::load_dir(a.model);
  if (!tmpl) {
    fmt::print(stderr, "error: {}\n", tmpl.message());
    return 1;
  }
  ChatPromptOptions opts;
  std::ifstream cfg_in(a.model + "/tokenizer_config.json");
  if (cfg_in) {
    std::stringstream ss;
    ss << cfg_in.rdbuf();
    nlohmann::json cfg = nlohmann::json::parse(ss.str(), nullptr, false);
    if (cfg.is_object()) {
      opts.bos_token = special_token(cfg, "bos_token");
      opts.eos_token = special_token(cfg, "eos_token");
    }
  }
  if (a.no_thinking) opts.enable_thinking = false;
  std::ios::sync_with_stdio(false);
  std::string in((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  nlohmann::ordered_json request = nlohmann::ordered_json::parse(in, nullptr, false);
  if (request.is_discarded()) {
    fmt::print(stderr, "error: stdin is not a JSON document\n");
    return 1;
  }
  auto prompt = render_chat_prompt(tmpl.value(), request, opts);
  if (!prompt) {
    fmt::print(stderr, "error: {}\n", prompt.message());
    return 1;
  }
  std::fwrite(prompt.value().data(), 1, prompt.value().size(), stdout);
  return 0;
}

Registrar reg("render", "Render stdin's chat request (OpenAI JSON) through the model's chat template",
              [](CLI::App& app) -> RunFn {
                auto a = std::make_shared<RenderArgs>();
                app.add_option("--model", a->model, "Checkpoint directory (chat_template.jinja or tokenizer_config.json)")
                    ->required();
                app.add_flag("--no-thinking", a->no_thinking, "Set enable_thinking=false (overrides the request)");
                return [a] { return run_render(*a); };
              });

}  // namespace
}  // namespace lily::cli
