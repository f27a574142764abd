// The checkpoint's chat template, rendered by lily's own Jinja interpreter (src/text/jinja/),
// configured as HF transformers configures jinja2: trim_blocks, lstrip_blocks, default Undefined,
// tojson = json.dumps(ensure_ascii=False), raise_exception and strftime_now globals.
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace lily {

namespace jinja {
struct Stmt;
}

class ChatTemplate {
 public:
  // Load-time errors (syntax, unsupported tags, unknown filters/tests) name the line.
  static Result<ChatTemplate> parse(const std::string& source);
  // dir/chat_template.jinja, else dir/tokenizer_config.json's "chat_template" (a string).
  static Result<ChatTemplate> load_dir(const std::string& dir);

  // context: a JSON object of variables (messages, tools, add_generation_prompt, bos_token, ...).
  // raise_exception(msg) in the template gives an error whose message is exactly msg; other
  // render-time errors are "chat template error (line N): ...".
  Result<std::string> render(const nlohmann::ordered_json& context) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const std::vector<std::shared_ptr<jinja::Stmt>>> body_;
};

}  // namespace lily
