// OpenAI request -> template context, mirrored line for line by openai_to_context() in
// tools/make_template_goldens.py (same rules, same error messages).
#include "text/chat_prompt.h"

#include <fmt/format.h>

#include "core/json_depth.h"

namespace lily {
namespace {

using ojson = nlohmann::ordered_json;
// Arguments arrive as JSON inside a string, past the request body's own depth limit.
constexpr size_t kMaxArgumentsDepth = 64;

Result<std::string> content_text(const ojson* content, const std::string& where) {
  if (!content || content->is_null()) return std::string();
  if (content->is_string()) return content->get<std::string>();
  if (!content->is_array()) return errorf("{}.content must be a string, an array of text parts, or null", where);
  std::string out;
  for (size_t k = 0; k < content->size(); ++k) {
    const ojson& part = (*content)[k];
    if (!part.is_object()) return errorf("{}.content[{}] must be an object", where, k);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string() || type->get<std::string>() != "text") {
      std::string kind = type == part.end() ? "None" : (type->is_string() ? type->get<std::string>() : type->dump());
      return errorf("{}.content[{}]: unsupported content part type '{}' (only 'text')", where, k, kind);
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return errorf("{}.content[{}].text must be a string", where, k);
    out += text->get<std::string>();
  }
  return out;
}

const ojson* field(const ojson& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

Result<ojson> convert_tool_call(const ojson& tc, const std::string& where) {
  if (!tc.is_object()) return errorf("{} must be an object", where);
  const ojson* fn = field(tc, "function");
  if (!fn || !fn->is_object() || !field(*fn, "name") || !(*fn)["name"].is_string())
    return errorf("{}.function must be an object with a string name", where);
  const ojson* args = field(*fn, "arguments");
  ojson parsed = ojson::object();
  if (args && args->is_string()) {
    if (json_nesting_depth(args->get<std::string>()) > kMaxArgumentsDepth)
      return errorf("{}.function.arguments nests deeper than {} levels", where, kMaxArgumentsDepth);
    parsed = ojson::parse(args->get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) return errorf("{}.function.arguments is not valid JSON", where);
    if (!parsed.is_object()) return errorf("{}.function.arguments must be a JSON object", where);
  } else if (args) {
    if (!args->is_object()) return errorf("{}.function.arguments must be a JSON object or a string holding one", where);
    parsed = *args;
  }
  ojson out = tc;
  out["function"]["arguments"] = std::move(parsed);
  return out;
}

}  // namespace

Result<ojson> chat_template_context(const ojson& request, const ChatPromptOptions& opts) {
  if (!request.is_object()) return errorf("request body must be a JSON object");
  const ojson* messages = field(request, "messages");
  if (!messages || !messages->is_array()) return errorf("'messages' must be an array");
  ojson msgs = ojson::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const ojson& m = (*messages)[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) return errorf("{} must be an object", where);
    const ojson* role_v = field(m, "role");
    std::string role = role_v && role_v->is_string() ? role_v->get<std::string>() : "";
    if (role != "system" && role != "developer" && role != "user" && role != "assistant" && role != "tool")
      return errorf("{}.role must be one of system, developer, user, assistant, tool", where);
    if (role == "developer") role = "system";
    ojson out = ojson::object();
    out["role"] = role;
    LILY_ASSIGN_OR_RETURN(out["content"], content_text(field(m, "content"), where));
    if (role == "assistant") {
      if (const ojson* rc = field(m, "reasoning_content")) {
        if (!rc->is_string()) return errorf("{}.reasoning_content must be a string", where);
        out["reasoning_content"] = *rc;
      }
      if (const ojson* tcs = field(m, "tool_calls")) {
        if (!tcs->is_array()) return errorf("{}.tool_calls must be an array", where);
        ojson calls = ojson::array();
        for (size_t k = 0; k < tcs->size(); ++k) {
          LILY_ASSIGN_OR_RETURN(ojson c, convert_tool_call((*tcs)[k], fmt::format("{}.tool_calls[{}]", where, k)));
          calls.push_back(std::move(c));
        }
        out["tool_calls"] = std::move(calls);
      }
    }
    if (role == "tool") {
      for (const char* key : {"tool_call_id", "name"})
        if (const ojson* v = field(m, key)) out[key] = *v;
    }
    msgs.push_back(std::move(out));
  }
  ojson ctx = ojson::object();
  ctx["messages"] = std::move(msgs);
  if (const ojson* tools = field(request, "tools")) {
    if (!tools->is_array()) return errorf("'tools' must be an array");
    ctx["tools"] = *tools;
  }
  ctx["add_generation_prompt"] = true;
  if (!opts.bos_token.empty()) ctx["bos_token"] = opts.bos_token;
  if (!opts.eos_token.empty()) ctx["eos_token"] = opts.eos_token;
  if (const ojson* kwargs = field(request, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return errorf("'chat_template_kwargs' must be an object");
    for (auto& [k, v] : kwargs->items()) ctx[k] = v;
  }
  if (opts.enable_thinking) ctx["enable_thinking"] = *opts.enable_thinking;
  return ctx;
}

Result<std::string> render_chat_prompt(const ChatTemplate& tmpl, const ojson& request, const ChatPromptOptions& opts) {
  LILY_ASSIGN_OR_RETURN(ojson ctx, chat_template_context(request, opts));
  return tmpl.render(ctx);
}

Result<std::string> render_chat_prompt(const ChatTemplate& tmpl, const nlohmann::json& request,
                                       const ChatPromptOptions& opts) {
  return render_chat_prompt(tmpl, ojson(request), opts);
}

}  // namespace lily
