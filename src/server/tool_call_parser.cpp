// ToolCallParser: see tool_call_parser.h. Whitespace in content is held back while a call may
// follow it, because the template writes "content\n\n<tool_call>" and the blank lines belong to
// the call, not to the answer. Inside a call only text that could still be a closing tag (or the
// newline that frames a value) is held back, so arguments stream with the tokens.
#include "server/tool_call_parser.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "core/json_depth.h"
#include "server/reasoning_parser.h"  // partial_suffix

namespace lily {

using json = nlohmann::ordered_json;
using nlohmann::ordered_json;

static constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>";
static constexpr std::string_view kFn = "<function=", kFnEnd = "</function>";
static constexpr std::string_view kP = "<parameter=", kPEnd = "</parameter>";

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
static std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}
static bool all_ws(std::string_view s) { return trim(s).empty(); }
static size_t leading_ws(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

// ---- ReplyDelta ----

void ReplyDelta::add_text(ReplyItem::Kind k, std::string_view s) {
  if (s.empty()) return;
  if (!items.empty() && items.back().kind == k && k != ReplyItem::Kind::kCall) {
    items.back().text.append(s);
    return;
  }
  ReplyItem it;
  it.kind = k;
  it.text = std::string(s);
  items.push_back(std::move(it));
}

void ReplyDelta::add(ReplyItem it) {
  if (it.kind != ReplyItem::Kind::kCall) return add_text(it.kind, it.text);
  // A call's argument pieces merge unless one begins or ends the call.
  if (!items.empty() && items.back().kind == ReplyItem::Kind::kCall && items.back().call == it.call &&
      !items.back().end && !it.begin) {
    items.back().text += it.text;
    items.back().end = it.end;
    return;
  }
  items.push_back(std::move(it));
}

void ReplyDelta::append(ReplyDelta&& d) {
  for (auto& it : d.items) add(std::move(it));
}

std::string ReplyDelta::text(ReplyItem::Kind k) const {
  std::string s;
  for (const auto& it : items)
    if (it.kind == k) s += it.text;
  return s;
}

std::vector<ToolCall> ReplyDelta::calls() const {
  std::vector<ToolCall> out;
  std::vector<int> index;
  for (const auto& it : items) {
    if (it.kind != ReplyItem::Kind::kCall) continue;
    if (it.begin) {
      out.push_back({it.id, it.name, ""});
      index.push_back(it.call);
    }
    for (size_t i = 0; i < out.size(); ++i)
      if (index[i] == it.call) out[i].arguments += it.text;
  }
  return out;
}

// ---- typing parameter values ----

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

static std::vector<std::string> schema_types(const json& schema) {
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
  return types;
}

ordered_json typed_value(const std::string& raw, const json& schema) {
  // Non-string types first: "5" for ["string", "integer"] is more likely meant as a number,
  // but text that only parses as a string stays a string.
  for (const auto& t : schema_types(schema))
    if (t != "string")
      if (auto v = as_type(raw, t)) return *v;
  return ordered_json(raw);  // no schema, "string", or nothing matched: keep the text
}

// JSON string escaping of a piece of a string value (without the quotes), exactly as a dump of
// the whole string would write it: escapes are per character and pieces end between characters.
static std::string escaped(std::string_view s) {
  std::string d = ordered_json(std::string(s)).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  return d.substr(1, d.size() - 2);
}

// ---- the parser ----

ToolCallParser::ToolCallParser(json tools, bool parallel, uint64_t id_seed)
    : tools_(std::move(tools)), parallel_(parallel), rng_(id_seed) {}

std::string ToolCallParser::new_id() {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[rng_() % 62];
  return id;
}

void ToolCallParser::push(std::string_view piece, ReplyDelta& out) {
  buf_.append(piece);
  step(out, false);
}

void ToolCallParser::flush(ReplyDelta& out) { step(out, true); }

void ToolCallParser::args(ReplyDelta& out, std::string_view s, bool end) {
  if (muted_ || (s.empty() && !end)) return;
  ReplyItem it;
  it.kind = ReplyItem::Kind::kCall;
  it.call = n_calls_ - 1;
  it.text = std::string(s);
  it.end = end;
  out.add(std::move(it));
}

void ToolCallParser::end_call(ReplyDelta& out) {
  args(out, "}", true);
  muted_ = false;
  mode_ = Mode::kAfterFunction;
}

// The value text of the open parameter ends here (`raw`: without its closing tag).
void ToolCallParser::close_value(ReplyDelta& out, std::string_view raw) {
  if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);  // the template's framing
  if (string_param_) args(out, escaped(raw) + "\"");
  else args(out, typed_value(std::string(raw), param_schema_).dump(-1, ' ', false, ordered_json::error_handler_t::replace));
  mode_ = Mode::kBody;
}

void ToolCallParser::step(ReplyDelta& out, bool final) {
  for (;;) {
    switch (mode_) {
      case Mode::kText: {
        size_t open = buf_.find(kOpen);
        if (open != std::string::npos) {
          std::string_view before = std::string_view(buf_).substr(0, open);
          size_t end = before.size();
          while (end > 0 && is_ws(before[end - 1])) --end;
          out.add_text(ReplyItem::Kind::kContent, before.substr(0, end));  // blank text before a call is framing
          ws_before_ = before.substr(end);  // given back if the call turns out not to be one
          buf_.erase(0, open + kOpen.size());
          mode_ = Mode::kHead;
          continue;
        }
        if (final) {
          if (!(n_calls_ > 0 && all_ws(buf_))) out.add_text(ReplyItem::Kind::kContent, buf_);  // trailing blank after calls: framing
          buf_.clear();
          return;
        }
        size_t end = buf_.size() - partial_suffix(buf_, kOpen);
        while (end > 0 && is_ws(buf_[end - 1])) --end;  // may precede a call: hold it
        out.add_text(ReplyItem::Kind::kContent, std::string_view(buf_).substr(0, end));
        buf_.erase(0, end);
        return;
      }
      case Mode::kHead: {  // blank, then <function=NAME>
        const size_t ws = leading_ws(buf_);
        std::string_view s = std::string_view(buf_).substr(ws);
        bool malformed = false;
        if (s.substr(0, kFn.size()) == kFn) {
          const size_t gt = s.find('>');
          // The text up to '>' (all of it while '>' has not come). A '<' or newline in it makes the
          // tag malformed; checked before trimming, so the verdict is the same however the reply is
          // cut ("<function=f\n>" is malformed whole and in pieces).
          const std::string_view raw = gt == std::string_view::npos ? s.substr(kFn.size()) : s.substr(kFn.size(), gt - kFn.size());
          const std::string_view name = trim(raw);
          if (raw.find_first_of("<\n") != std::string_view::npos) {
            malformed = true;
          } else if (gt == std::string_view::npos) {
            if (!final) return;
            malformed = true;
          } else if (name.empty() || (has_functions(tools_) && !find_function(tools_, name))) {
            malformed = true;
          } else {  // a known function: the call starts
            ReplyItem it;
            it.kind = ReplyItem::Kind::kCall;
            it.call = n_calls_++;
            it.id = new_id();
            it.name = std::string(name);
            it.begin = true;
            it.text = "{";
            muted_ = n_calls_ > 1 && !parallel_;  // parallel_tool_calls = false: the first call only
            if (!muted_) out.add(std::move(it));
            else --n_calls_;
            const json* fn = find_function(tools_, name);
            param_schema_ = json();
            props_ = fn && fn->contains("parameters") && (*fn)["parameters"].is_object() &&
                             (*fn)["parameters"].contains("properties") && (*fn)["parameters"]["properties"].is_object()
                         ? (*fn)["parameters"]["properties"]
                         : json::object();
            buf_.erase(0, ws + gt + 1);
            ws_before_.clear();
            first_param_ = true;
            mode_ = Mode::kBody;
            continue;
          }
        } else if (!final && kFn.substr(0, s.size()) == s) {
          return;  // could still be <function=
        } else {
          malformed = true;
        }
        if (malformed) {  // not a call: the text is content, scanned again from after the tag
          out.add_text(ReplyItem::Kind::kContent, ws_before_);
          out.add_text(ReplyItem::Kind::kContent, kOpen);
          ws_before_.clear();
          mode_ = Mode::kText;
          continue;
        }
        return;
      }
      case Mode::kBody: {  // blank, then <parameter=P>, </function> or </tool_call>
        buf_.erase(0, leading_ws(buf_));
        std::string_view s(buf_);
        if (s.substr(0, kP.size()) == kP) {
          const size_t gt = s.find('>');
          if (gt == std::string_view::npos) {
            if (!final) return;
            end_call(out);
            buf_.clear();
            continue;
          }
          const std::string pname(trim(s.substr(kP.size(), gt - kP.size())));
          param_schema_ = props_.contains(pname) ? props_[pname] : json();
          const auto types = schema_types(param_schema_);
          string_param_ = types.size() == 1 && types[0] == "string";
          std::string head = (first_param_ ? "" : ",") + ordered_json(pname).dump(-1, ' ', false, ordered_json::error_handler_t::replace) + ":";
          if (string_param_) head += "\"";
          args(out, head);
          first_param_ = false;
          buf_.erase(0, gt + 1);
          skip_newline_ = true;
          mode_ = Mode::kValue;
          continue;
        }
        if (s.substr(0, kFnEnd.size()) == kFnEnd) {
          buf_.erase(0, kFnEnd.size());
          end_call(out);
          continue;
        }
        if (s.substr(0, kClose.size()) == kClose) {
          buf_.erase(0, kClose.size());
          end_call(out);
          mode_ = Mode::kText;
          continue;
        }
        const bool maybe_tag = kP.substr(0, s.size()) == s || kFnEnd.substr(0, s.size()) == s || kClose.substr(0, s.size()) == s;
        if (maybe_tag && !final) return;
        if (final) {
          end_call(out);
          buf_.clear();
          continue;
        }
        // Something else inside a call: skipped up to the next tag.
        const size_t lt = buf_.find('<', 1);
        buf_.erase(0, lt == std::string::npos ? buf_.size() : lt);
        continue;
      }
      case Mode::kValue: {
        if (skip_newline_) {
          if (buf_.empty() && !final) return;
          if (!buf_.empty() && buf_[0] == '\n') buf_.erase(0, 1);
          skip_newline_ = false;
        }
        // The value ends at </parameter>, or (malformed) at the end of the function or call.
        size_t at = std::string::npos;
        std::string_view tag;
        for (std::string_view t : {kPEnd, kFnEnd, kClose})
          if (size_t p = buf_.find(t); p < at) at = p, tag = t;
        if (at != std::string::npos) {
          close_value(out, std::string_view(buf_).substr(0, at));
          buf_.erase(0, at + (tag == kPEnd ? tag.size() : 0));
          continue;
        }
        if (final) {
          close_value(out, buf_);
          buf_.clear();
          end_call(out);
          continue;
        }
        if (!string_param_) return;  // typed values go out whole
        size_t hold = std::max({partial_suffix(buf_, kPEnd), partial_suffix(buf_, kFnEnd), partial_suffix(buf_, kClose)});
        if (hold < buf_.size() && buf_[buf_.size() - hold - 1] == '\n') ++hold;  // may be the framing newline
        const size_t n = buf_.size() - hold;
        args(out, escaped(std::string_view(buf_).substr(0, n)));
        buf_.erase(0, n);
        return;
      }
      case Mode::kAfterFunction: {  // blank, then </tool_call>
        const size_t ws = leading_ws(buf_);
        std::string_view s = std::string_view(buf_).substr(ws);
        if (s.substr(0, kClose.size()) == kClose) {
          buf_.erase(0, ws + kClose.size());
          mode_ = Mode::kText;
          continue;
        }
        if (!final && kClose.substr(0, s.size()) == s) return;
        mode_ = Mode::kText;  // the call has ended; what follows is content
        continue;
      }
    }
  }
}

}  // namespace lily
