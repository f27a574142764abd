// ToolCallParser: see tool_call_parser.h. Whitespace in content is held back while a call may
// follow it, because the template writes "content\n\n<tool_call>" and the blank lines belong
// to the call, not to the answer.
#include "server/tool_call_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "core/json_depth.h"
#include "server/reasoning_parser.h"  // partial_suffix

namespace lily {

using json = nlohmann::ordered_json;
using nlohmann::ordered_json;

static constexpr std::string_view kOpen = "<tool_call>";
static constexpr std::string_view kClose = "</tool_call>";

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}
static bool all_ws(std::string_view s) { return trim(s).empty(); }

static const json* find_function(const json& tools, std::string_view name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const auto& f = t["function"];
    if (f.contains("name") && f["name"].is_string() && f["name"].get<std::string>() == name) return &f;
  }
  return nullptr;
}

static bool has_functions(const json& tools) { return tools.is_array() && !tools.empty(); }

static std::optional<ordered_json> as_type(const std::string& raw, const std::string& type) {
  std::string_view t = trim(raw);
  std::string s(t);
  if (type == "string") return ordered_json(raw);
  if (type == "integer" || type == "number") {
    if (s.empty()) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    long long i = std::strtoll(s.c_str(), &end, 10);
    if (errno == 0 && end == s.c_str() + s.size()) return ordered_json(i);
    if (type == "integer") return std::nullopt;
    errno = 0;
    double d = std::strtod(s.c_str(), &end);
    if (errno == 0 && end == s.c_str() + s.size()) return ordered_json(d);
    return std::nullopt;
  }
  if (type == "boolean") {
    std::string l = s;
    std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    if (l == "true") return ordered_json(true);
    if (l == "false") return ordered_json(false);
    return std::nullopt;
  }
  if (type == "null") {
    if (s == "null" || s == "None") return ordered_json(nullptr);
    return std::nullopt;
  }
  if (type == "object" || type == "array") {
    if (json_nesting_depth(s) > 64) return std::nullopt;  // kept as text: deeper would overflow dump()
    auto v = ordered_json::parse(s, nullptr, false);
    if (v.is_discarded()) return std::nullopt;
    if (type == "object" ? v.is_object() : v.is_array()) return v;
    return std::nullopt;
  }
  return std::nullopt;
}

ordered_json typed_value(const std::string& raw, const json& schema) {
  std::vector<std::string> types;
  auto collect = [&](const json& s) {
    if (!s.is_object() || !s.contains("type")) return;
    if (s["type"].is_string()) types.push_back(s["type"]);
    else if (s["type"].is_array())
      for (const auto& t : s["type"])
        if (t.is_string()) types.push_back(t);
  };
  collect(schema);
  for (const char* key : {"anyOf", "oneOf"})
    if (schema.is_object() && schema.contains(key) && schema[key].is_array())
      for (const auto& s : schema[key]) collect(s);
  // Non-string types first: "5" for ["string", "integer"] is more likely meant as a number,
  // but text that only parses as a string stays a string.
  for (const auto& t : types)
    if (t != "string")
      if (auto v = as_type(raw, t)) return *v;
  return ordered_json(raw);  // no schema, "string", or nothing matched: keep the text
}

std::optional<ToolCall> parse_tool_call_block(std::string_view block, const json& tools) {
  std::string_view s = trim(block);
  constexpr std::string_view kFn = "<function=", kFnEnd = "</function>";
  constexpr std::string_view kP = "<parameter=", kPEnd = "</parameter>";
  if (s.substr(0, kFn.size()) != kFn) return std::nullopt;
  size_t gt = s.find('>');
  if (gt == std::string_view::npos) return std::nullopt;
  std::string name(trim(s.substr(kFn.size(), gt - kFn.size())));
  if (name.empty() || name.find_first_of("<\n") != std::string::npos) return std::nullopt;
  if (s.size() < kFnEnd.size() || s.substr(s.size() - kFnEnd.size()) != kFnEnd) return std::nullopt;
  std::string_view body = s.substr(gt + 1, s.size() - kFnEnd.size() - gt - 1);

  const json* fn = find_function(tools, name);
  if (has_functions(tools) && !fn) return std::nullopt;
  json props = json::object();
  if (fn && fn->contains("parameters") && (*fn)["parameters"].is_object() &&
      (*fn)["parameters"].contains("properties") && (*fn)["parameters"]["properties"].is_object())
    props = (*fn)["parameters"]["properties"];

  ordered_json args = ordered_json::object();
  for (;;) {
    body = trim(body);
    if (body.empty()) break;
    if (body.substr(0, kP.size()) != kP) return std::nullopt;
    size_t pgt = body.find('>');
    if (pgt == std::string_view::npos) return std::nullopt;
    std::string pname(trim(body.substr(kP.size(), pgt - kP.size())));
    if (pname.empty()) return std::nullopt;
    size_t pend = body.find(kPEnd, pgt + 1);
    if (pend == std::string_view::npos) return std::nullopt;
    std::string_view v = body.substr(pgt + 1, pend - pgt - 1);
    // The template writes "\nVALUE\n": one newline on each side is framing.
    if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
    if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
    json schema = props.contains(pname) ? props[pname] : json();
    args[pname] = typed_value(std::string(v), schema);
    body = body.substr(pend + kPEnd.size());
  }
  return ToolCall{"", name, args.dump()};
}

ToolCallParser::ToolCallParser(json tools, bool parallel, uint64_t id_seed)
    : tools_(std::move(tools)), parallel_(parallel), rng_(id_seed) {}

std::string ToolCallParser::new_id() {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[rng_() % 62];
  return id;
}

ToolCallParser::Delta ToolCallParser::push(std::string_view piece) {
  Delta out;
  buf_.append(piece);
  step(out, false);
  return out;
}

ToolCallParser::Delta ToolCallParser::flush() {
  Delta out;
  step(out, true);
  return out;
}

void ToolCallParser::finish_call(Delta& out, std::string_view block, bool closed) {
  auto call = parse_tool_call_block(block, tools_);
  if (!call) {  // not a call after all: give the text back verbatim
    out.content.append(ws_before_);
    out.content.append(kOpen);
    out.content.append(block);
    if (closed) out.content.append(kClose);
    return;
  }
  ws_before_.clear();
  if (n_calls_ > 0 && !parallel_) return;  // parallel_tool_calls=false: the first call only
  call->id = new_id();
  out.calls.push_back(std::move(*call));
  ++n_calls_;
}

void ToolCallParser::step(Delta& out, bool final) {
  for (;;) {
    if (in_call_) {
      size_t close = buf_.find(kClose);
      if (close != std::string::npos) {
        finish_call(out, std::string_view(buf_).substr(0, close), true);
        buf_.erase(0, close + kClose.size());
        in_call_ = false;
        continue;
      }
      if (final) {  // unfinished: a call only if the function itself is complete
        finish_call(out, buf_, false);
        buf_.clear();
        in_call_ = false;
      }
      return;
    }
    size_t open = buf_.find(kOpen);
    if (open != std::string::npos) {
      std::string_view before = std::string_view(buf_).substr(0, open);
      // Blank text just before a call is framing; real text stays content.
      size_t end = before.size();
      while (end > 0 && is_ws(before[end - 1])) --end;
      out.content.append(before.substr(0, end));
      ws_before_ = before.substr(end);  // given back if the call turns out malformed
      buf_.erase(0, open + kOpen.size());
      in_call_ = true;
      continue;
    }
    if (final) {
      // Whitespace after the last call is framing too.
      if (!(n_calls_ > 0 && all_ws(buf_))) out.content.append(buf_);  // trailing blank after calls: framing
      buf_.clear();
      return;
    }
    size_t end = buf_.size() - partial_suffix(buf_, kOpen);
    while (end > 0 && is_ws(buf_[end - 1])) --end;  // may precede a call: hold it
    out.content.append(buf_, 0, end);
    buf_.erase(0, end);
    return;
  }
}

}  // namespace lily
