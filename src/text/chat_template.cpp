// ChatTemplate: loads the template source, parses it once, renders it per request. The Jinja
// interpreter reports failures with an internal exception; this is the boundary that turns them
// into Status values.
#include "text/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/file.h"
#include "core/json_depth.h"
#include "text/jinja/interp.h"
#include "text/jinja/lexer.h"
#include "text/jinja/parser.h"

namespace lily {


Result<ChatTemplate> ChatTemplate::parse(const std::string& source) {
  ChatTemplate t;
  t.source_ = source;
  try {
    auto body = jinja::parse(jinja::lex(source));
    t.body_ = std::make_shared<const jinja::Body>(std::move(body));
  } catch (const jinja::Error& e) {
    return errorf("chat template line {}: {}", e.line, e.what());
  } catch (const std::exception& e) {  // a library error the interpreter did not map (a lily bug, not a crash)
    return errorf("chat template: {}", e.what());
  }
  return t;
}

Result<ChatTemplate> ChatTemplate::load_dir(const std::string& dir) {
  std::ifstream probe(dir + "/chat_template.jinja");
  if (probe) {
    LILY_ASSIGN_OR_RETURN(std::string src, read_file(dir + "/chat_template.jinja"));
    auto t = parse(src);
    if (!t) return errorf("{}/chat_template.jinja: {}", dir, t.message());
    return t;
  }
  std::string cfg_path = dir + "/tokenizer_config.json";
  LILY_ASSIGN_OR_RETURN(std::string cfg_text, read_file(cfg_path));
  if (json_nesting_depth(cfg_text) > 64) return errorf("{}: nests deeper than 64 levels", cfg_path);
  nlohmann::json cfg = nlohmann::json::parse(cfg_text, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) return errorf("{}: not a JSON object", cfg_path);
  auto it = cfg.find("chat_template");
  if (it == cfg.end()) return errorf("{}: no chat_template.jinja and no \"chat_template\" in {}", dir, cfg_path);
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {  // HF's named templates: [{"name": "default", "template": ...}, ...]
    for (auto& e : *it)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        source = e["template"].get<std::string>();
    if (source.empty()) return errorf("{}: \"chat_template\" list has no \"default\" template", cfg_path);
  } else {
    return errorf("{}: \"chat_template\" must be a string or a list of named templates", cfg_path);
  }
  auto t = parse(source);
  if (!t) return errorf("{}: {}", cfg_path, t.message());
  return t;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return errorf("chat template context must be a JSON object");
  try {
    jinja::Interp interp(jinja::Value::from_json(context));
    return interp.render(*body_);
  } catch (const jinja::Error& e) {
    if (e.raised) return Status::error(e.what());
    return errorf("chat template error (line {}): {}", e.line, e.what());
  } catch (const std::exception& e) {  // e.g. fmt::format_error, std::bad_alloc: an error, never a crash
    return errorf("chat template error: {}", e.what());
  }
}

}  // namespace lily
