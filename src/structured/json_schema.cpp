// SchemaCompiler: see json_schema.h. Bounds are converted exactly: a JSON number's shortest
// decimal form, scaled by 10^decimals and rounded inward, so every number the grammar allows
// compares with the bound as a JSON parser's double does (parsing is monotonic).
#include "structured/json_schema.h"

#include <charconv>
#include <cmath>
#include <set>

#include <fmt/format.h>

namespace lily::structured {

using ojson = nlohmann::ordered_json;

namespace {

constexpr int kAnyDepth = 6;          // nesting of values a schema leaves free
constexpr int kMaxSchemaDepth = 64;
constexpr size_t kMaxNodes = 20000;
constexpr size_t kMaxTrie = 2000000;
constexpr int64_t kMaxLength = 1000000;   // largest minLength/maxLength/minItems honoured exactly
constexpr int64_t kMaxMinItems = 10000;

const std::set<std::string> kUnsupported = {
    "pattern", "patternProperties", "propertyNames", "minProperties", "maxProperties", "dependentRequired",
    "dependentSchemas", "dependencies", "if", "then", "else", "not", "oneOf", "contains", "minContains",
    "maxContains", "multipleOf", "unevaluatedProperties", "unevaluatedItems", "$dynamicRef", "$recursiveRef"};
// Keywords that constrain a value (beside which $ref, allOf and anyOf are refused).
const std::set<std::string> kValidation = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems", "maxItems",
    "enum", "const", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "anyOf", "allOf", "$ref", "uniqueItems", "additionalItems"};

std::string pointer_token(const std::string& k) {
  std::string out;
  for (char c : k) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string percent_decode(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(uint8_t(s[i + 1])) && std::isxdigit(uint8_t(s[i + 2]))) {
      out += char(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// A JSON number times 10^scale, rounded up or down to an integer; false if not finite. Results
// beyond +-10^36 saturate there.
bool scaled_value(const ojson& v, int scale, bool up, i128& out) {
  std::string text;
  if (v.is_number_integer()) {
    text = v.dump();
  } else {
    const double d = v.get<double>();
    if (!std::isfinite(d)) return false;
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d);
    text.assign(buf, r.ptr);
  }
  bool neg = false;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') neg = true, ++i;
  std::string digits;
  int exp10 = 0;
  bool frac = false;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.') frac = true;
    else digits += text[i], exp10 -= frac ? 1 : 0;
  }
  if (i < text.size()) exp10 += std::atoi(text.c_str() + i + 1);
  const i128 cap = [] { i128 c = 1; for (int k = 0; k < 36; ++k) c *= 10; return c; }();
  i128 m = 0;
  bool saturated = false;
  for (char c : digits) {
    if (m > cap) { saturated = true; break; }
    m = m * 10 + (c - '0');
  }
  int e = exp10 + scale;
  if (saturated) e = 40;
  for (; e > 0 && m <= cap; --e) m *= 10;
  if (m > cap) m = cap, e = 0;
  bool inexact = false;
  for (; e < 0; ++e) {
    inexact = inexact || m % 10 != 0;
    m /= 10;
  }
  // m = trunc(|v| * 10^scale); round toward the requested side.
  if (inexact && (neg ? !up : up)) m += 1;
  out = neg ? -m : m;
  return true;
}

int digits_of(i128 v) {
  if (v < 0) v = -v;
  int n = 1;
  while (v >= 10) v /= 10, ++n;
  return n;
}

}  // namespace

SchemaCompiler::SchemaCompiler(GrammarBuilder& b, const ojson& root) : b_(b), root_(root) {}

void SchemaCompiler::fail(const std::string& msg) {
  if (errors_.size() < 16) errors_.push_back(msg);
}

std::string SchemaCompiler::error() const {
  std::string out;
  if (!unsupported_.empty()) {
    out = "unsupported JSON Schema keyword" + std::string(unsupported_.size() > 1 ? "s" : "") + ": ";
    for (size_t i = 0; i < unsupported_.size(); ++i) out += (i ? ", " : "") + unsupported_[i];
  }
  for (const auto& e : errors_) out += (out.empty() ? "" : "; ") + e;
  return out;
}

uint32_t SchemaCompiler::nothing() { return b_.alt({}); }

bool SchemaCompiler::length(const ojson& s, const char* key, const std::string& path, int64_t& out) {
  if (!s.contains(key)) return false;
  const ojson& v = s[key];
  if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    fail(fmt::format("'{}' at {} must be a non-negative integer", key, path));
    return false;
  }
  const uint64_t u = v.get<uint64_t>();
  out = int64_t(std::min<uint64_t>(u, uint64_t(kInf)));
  return true;
}

uint32_t SchemaCompiler::compile(const ojson& s, const std::string& path, ValueSyntax syntax) {
  struct Depth {
    int& d;
    ~Depth() { --d; }
  } guard{++depth_};
  if (depth_ > kMaxSchemaDepth) {
    fail(fmt::format("the schema nests deeper than {} levels at {}", kMaxSchemaDepth, path));
    return nothing();
  }
  if (b_.n_nodes() > kMaxNodes || b_.trie_size() > kMaxTrie) {
    fail("the schema is too large");
    return nothing();
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return syntax == ValueSyntax::kToolParam ? tool_param(ojson::object(), path) : b_.any_value(kAnyDepth);
    fail(fmt::format("the schema at {} is 'false': no value satisfies it", path));
    return nothing();
  }
  if (!s.is_object()) {
    fail(fmt::format("the schema at {} must be an object or a boolean", path));
    return nothing();
  }
  for (const auto& [k, v] : s.items())
    if (kUnsupported.count(k)) unsupported_.push_back(fmt::format("'{}' at {}", k, path));
  if (s.contains("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()))
    unsupported_.push_back(fmt::format("'uniqueItems' at {}", path));
  if (s.contains("additionalItems") && !s["additionalItems"].is_boolean())
    unsupported_.push_back(fmt::format("'additionalItems' (a schema) at {}", path));
  auto siblings = [&](const char* kw) {
    for (const auto& [k, v] : s.items())
      if (k != kw && kValidation.count(k) && !(std::string(kw) == "anyOf" && k == "nullable"))
        unsupported_.push_back(fmt::format("'{}' beside '{}' at {}", k, kw, path));
  };
  if (s.contains("$ref")) {
    siblings("$ref");
    if (!s["$ref"].is_string()) {
      fail(fmt::format("'$ref' at {} must be a string", path));
      return nothing();
    }
    return ref(s["$ref"].get<std::string>(), path, syntax);
  }
  if (s.contains("allOf")) {
    const ojson& all = s["allOf"];
    if (!all.is_array() || all.size() != 1) {
      unsupported_.push_back(fmt::format("'allOf' with {} schemas at {} (only one is supported)",
                                         all.is_array() ? all.size() : 0, path));
      return nothing();
    }
    siblings("allOf");
    return compile(all[0], path + "/allOf/0", syntax);
  }
  if (syntax == ValueSyntax::kToolParam) return tool_param(s, path);

  uint32_t node;
  if (s.contains("anyOf")) {
    siblings("anyOf");
    const ojson& any = s["anyOf"];
    if (!any.is_array() || any.empty()) {
      fail(fmt::format("'anyOf' at {} must be a non-empty array", path));
      return nothing();
    }
    std::vector<uint32_t> alts;
    for (size_t i = 0; i < any.size(); ++i) alts.push_back(compile(any[i], fmt::format("{}/anyOf/{}", path, i)));
    node = b_.alt(std::move(alts));
  } else if (s.contains("const")) {
    node = b_.literal({s["const"].dump()});
  } else if (s.contains("enum")) {
    const ojson& e = s["enum"];
    if (!e.is_array() || e.empty()) {
      fail(fmt::format("'enum' at {} must be a non-empty array", path));
      return nothing();
    }
    std::set<std::string> types;
    if (s.contains("type") && s["type"].is_string()) types.insert(s["type"].get<std::string>());
    if (s.contains("type") && s["type"].is_array())
      for (const auto& t : s["type"])
        if (t.is_string()) types.insert(t.get<std::string>());
    auto type_ok = [&](const ojson& v) {
      if (types.empty()) return true;
      if (v.is_string()) return types.count("string") > 0;
      if (v.is_boolean()) return types.count("boolean") > 0;
      if (v.is_null()) return types.count("null") > 0;
      if (v.is_object()) return types.count("object") > 0;
      if (v.is_array()) return types.count("array") > 0;
      if (types.count("number")) return true;
      return types.count("integer") > 0 && (v.is_number_integer() || std::floor(v.get<double>()) == v.get<double>());
    };
    std::vector<std::string> lits;
    for (const auto& v : e)
      if (type_ok(v)) lits.push_back(v.dump());
    if (lits.empty()) {
      fail(fmt::format("no value of 'enum' at {} has the schema's type", path));
      return nothing();
    }
    node = b_.literal(lits);
  } else {
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) types.push_back(t.get<std::string>());
      else if (t.is_array())
        for (const auto& x : t) {
          if (x.is_string()) types.push_back(x.get<std::string>());
          else fail(fmt::format("'type' at {} must name types", path));
        }
      else fail(fmt::format("'type' at {} must be a string or an array of strings", path));
    } else {
      // No type: what the keywords are about (none: any value).
      auto has = [&](std::initializer_list<const char*> ks) {
        for (const char* k : ks)
          if (s.contains(k)) return true;
        return false;
      };
      if (has({"properties", "required", "additionalProperties"})) types.push_back("object");
      if (has({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
      if (has({"minLength", "maxLength"})) types.push_back("string");
      if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) types.push_back("number");
    }
    if (types.empty()) {
      node = b_.any_value(kAnyDepth);
    } else {
      std::vector<uint32_t> alts;
      for (const auto& t : types) alts.push_back(compile_typed(s, t, path));
      node = alts.size() == 1 ? alts[0] : b_.alt(std::move(alts));
    }
  }
  if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>())
    node = b_.alt({node, b_.literal({"null"})});
  return node;
}

uint32_t SchemaCompiler::compile_typed(const ojson& s, const std::string& type, const std::string& path) {
  if (type == "string") {
    int64_t lo = 0, hi = kInf;
    length(s, "minLength", path, lo);
    length(s, "maxLength", path, hi);
    if (lo > kMaxLength) fail(fmt::format("'minLength' at {} is over {}", path, kMaxLength));
    if (lo > hi) fail(fmt::format("'minLength' is greater than 'maxLength' at {}", path));
    return b_.text(lo, hi);
  }
  if (type == "integer" || type == "number") return compile_number(s, type == "integer", path);
  if (type == "boolean") return b_.literal({"true", "false"});
  if (type == "null") return b_.literal({"null"});
  if (type == "object") return compile_object(s, path);
  if (type == "array") return compile_array(s, path);
  fail(fmt::format("unknown type '{}' at {}", type, path));
  return nothing();
}

uint32_t SchemaCompiler::compile_number(const ojson& s, bool integer, const std::string& path) {
  NumNode n;
  n.frac_digits = integer ? 0 : 6;
  n.int_digits = 15;
  i128 lo = 0, hi = 0;
  bool has_lo = false, has_hi = false;
  // The smallest allowed grid value above a lower bound (ceil, or floor + 1 when exclusive), the
  // largest below an upper one (floor, or ceil - 1).
  auto bound = [&](const char* key, bool lower, bool exclusive) {
    if (!s.contains(key) || s[key].is_boolean()) return;
    if (!s[key].is_number()) {
      fail(fmt::format("'{}' at {} must be a number", key, path));
      return;
    }
    i128 v;
    if (!scaled_value(s[key], n.frac_digits, lower != exclusive, v)) return;
    if (exclusive) v += lower ? 1 : -1;
    if (lower) lo = has_lo ? std::max(lo, v) : v, has_lo = true;
    else hi = has_hi ? std::min(hi, v) : v, has_hi = true;
  };
  // Draft 4 spells exclusivity as booleans beside minimum/maximum.
  auto flag = [&](const char* k) { return s.contains(k) && s[k].is_boolean() && s[k].get<bool>(); };
  bound("minimum", true, flag("exclusiveMinimum"));
  bound("maximum", false, flag("exclusiveMaximum"));
  bound("exclusiveMinimum", true, true);
  bound("exclusiveMaximum", false, true);
  const i128 scale = [&] { i128 p = 1; for (int k = 0; k < n.frac_digits; ++k) p *= 10; return p; }();
  for (i128 b : {has_lo ? lo : i128(0), has_hi ? hi : i128(0)}) {
    const int d = digits_of(b / scale);
    if (d > n.int_digits) n.int_digits = std::min(18, d);
  }
  i128 gmax = 1;
  for (int k = 0; k < n.int_digits; ++k) gmax *= 10;
  gmax = gmax * scale - 1;
  n.bounded = has_lo || has_hi;
  n.lo = has_lo ? std::max(lo, -gmax) : -gmax;
  n.hi = has_hi ? std::min(hi, gmax) : gmax;
  if (n.lo > n.hi) {
    fail(fmt::format("no {} lies within the bounds at {}", integer ? "integer" : "number", path));
    return nothing();
  }
  return b_.number(n);
}

uint32_t SchemaCompiler::compile_object(const ojson& s, const std::string& path) {
  const ojson empty = ojson::object();
  const ojson& props = s.contains("properties") ? s["properties"] : empty;
  if (!props.is_object()) {
    fail(fmt::format("'properties' at {} must be an object", path));
    return nothing();
  }
  std::vector<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) fail(fmt::format("'required' at {} must be an array of strings", path));
    else
      for (const auto& r : s["required"]) {
        if (r.is_string()) required.push_back(r.get<std::string>());
        else fail(fmt::format("'required' at {} must be an array of strings", path));
      }
  }
  const bool closed = s.contains("additionalProperties") && s["additionalProperties"].is_boolean() &&
                      !s["additionalProperties"].get<bool>();
  ObjNode o;
  o.open = "{";
  o.sep = ",";
  o.close = "}";
  if (props.empty() && required.empty() && !closed) {  // a free map
    const ojson* addl = s.contains("additionalProperties") && s["additionalProperties"].is_object() ? &s["additionalProperties"] : nullptr;
    o.map_key = int32_t(b_.text(0, kInf));
    o.map_value = int32_t(addl ? compile(*addl, path + "/additionalProperties") : b_.any_value(kAnyDepth - 1));
    return b_.object(std::move(o));
  }
  auto is_required = [&](const std::string& k) { return std::find(required.begin(), required.end(), k) != required.end(); };
  for (const auto& [k, sub] : props.items())
    o.props.push_back({ojson(k).dump() + ":", compile(sub, path + "/properties/" + pointer_token(k)), "", is_required(k)});
  for (const auto& r : required) {
    if (props.contains(r)) continue;
    if (closed) {  // required, yet not allowed: nothing satisfies the schema
      fail(fmt::format("required property '{}' at {} is not in 'properties' and additionalProperties is false", r, path));
      return nothing();
    }
    o.props.push_back({ojson(r).dump() + ":", b_.any_value(kAnyDepth - 1), "", true});
  }
  return b_.object(std::move(o));
}

uint32_t SchemaCompiler::compile_array(const ojson& s, const std::string& path) {
  ArrNode a;
  a.open = "[";
  a.sep = ",";
  a.close = "]";
  const ojson* tuple = nullptr;
  std::string tuple_path;
  if (s.contains("prefixItems")) tuple = &s["prefixItems"], tuple_path = path + "/prefixItems";
  else if (s.contains("items") && s["items"].is_array()) tuple = &s["items"], tuple_path = path + "/items";
  if (tuple) {
    if (!tuple->is_array()) fail(fmt::format("'prefixItems' at {} must be an array", path));
    else
      for (size_t i = 0; i < tuple->size(); ++i) a.prefix.push_back(compile((*tuple)[i], fmt::format("{}/{}", tuple_path, i)));
  }
  const ojson* rest = nullptr;
  if (s.contains("items") && !s["items"].is_array()) rest = &s["items"];
  else if (tuple && s.contains("additionalItems")) rest = &s["additionalItems"];
  if (rest && rest->is_boolean() && !rest->get<bool>()) a.items = -1;
  else if (rest && rest->is_object()) a.items = int32_t(compile(*rest, path + (s.contains("prefixItems") || !tuple ? "/items" : "/additionalItems")));
  else a.items = int32_t(b_.any_value(kAnyDepth - 1));
  int64_t lo = 0, hi = kInf;
  length(s, "minItems", path, lo);
  length(s, "maxItems", path, hi);
  if (lo > kMaxMinItems) fail(fmt::format("'minItems' at {} is over {}", path, kMaxMinItems));
  if (lo > hi) fail(fmt::format("'minItems' is greater than 'maxItems' at {}", path));
  a.min = std::min(lo, kMaxMinItems);
  a.max = hi;
  return b_.array(std::move(a));
}

uint32_t SchemaCompiler::ref(const std::string& target, const std::string& path, ValueSyntax syntax) {
  if (target.empty() || target[0] != '#') {
    fail(fmt::format("'$ref' '{}' at {}: only references into the same schema ('#...') are supported", target, path));
    return nothing();
  }
  const std::string pointer = percent_decode(target.substr(1));
  const auto key = std::make_pair(pointer, int(syntax));
  if (auto it = refs_.find(key); it != refs_.end()) return it->second;
  const ojson* sub = nullptr;
  try {
    const nlohmann::json_pointer<std::string> ptr(pointer);
    if (root_.contains(ptr)) sub = &root_.at(ptr);
  } catch (const std::exception&) {
    sub = nullptr;
  }
  if (!sub) {
    fail(fmt::format("'$ref' '{}' at {} does not resolve", target, path));
    return nothing();
  }
  const uint32_t node = b_.placeholder();
  refs_[key] = node;
  b_.set_alts(node, {compile(*sub, target, syntax)});
  return node;
}

// A tool-call parameter's value, up to and including "\n</parameter>": strings are written raw
// (the Qwen template does so and the reply parser reads them so), everything else as compact JSON.
uint32_t SchemaCompiler::tool_param(const ojson& s, const std::string& path) {
  static const auto automaton = raw_automaton("\n</parameter>", {"</parameter>", "</tool_call>"});
  const std::string end = "\n</parameter>";
  auto json_value = [&](uint32_t node) { return b_.seq({node, b_.literal({end})}); };
  uint32_t node;
  if (s.contains("anyOf") && s["anyOf"].is_array() && !s["anyOf"].empty()) {
    std::vector<uint32_t> alts;
    for (size_t i = 0; i < s["anyOf"].size(); ++i)
      alts.push_back(compile(s["anyOf"][i], fmt::format("{}/anyOf/{}", path, i), ValueSyntax::kToolParam));
    node = b_.alt(std::move(alts));
  } else if (s.contains("enum") || s.contains("const")) {
    const ojson values = s.contains("const") ? ojson::array({s["const"]}) : s["enum"];
    if (!values.is_array() || values.empty()) {
      fail(fmt::format("'enum' at {} must be a non-empty array", path));
      return nothing();
    }
    std::vector<std::string> lits;
    for (const auto& v : values) {
      const std::string text = v.is_string() ? v.get<std::string>() : v.dump();
      if (text.find("</parameter>") == std::string::npos && text.find("</tool_call>") == std::string::npos)
        lits.push_back(text + end);
    }
    if (lits.empty()) fail(fmt::format("no value of 'enum' at {} can be written as a tool argument", path));
    node = b_.literal(lits);
  } else {
    std::vector<std::string> types;
    if (s.contains("type") && s["type"].is_string()) types.push_back(s["type"].get<std::string>());
    else if (s.contains("type") && s["type"].is_array())
      for (const auto& t : s["type"])
        if (t.is_string()) types.push_back(t.get<std::string>());
    const bool any_type = types.empty() && !s.contains("properties") && !s.contains("items");
    std::vector<uint32_t> alts;
    for (const auto& t : types) {
      if (t == "string") {
        int64_t lo = 0, hi = kInf;
        length(s, "minLength", path, lo);
        length(s, "maxLength", path, hi);
        if (lo > hi) fail(fmt::format("'minLength' is greater than 'maxLength' at {}", path));
        alts.push_back(b_.text(lo, hi, automaton));
      } else {
        alts.push_back(json_value(compile_typed(s, t, path)));
      }
    }
    if (any_type) alts.push_back(b_.text(0, kInf, automaton));
    if (types.empty() && !any_type) alts.push_back(json_value(compile(s, path)));
    node = alts.size() == 1 ? alts[0] : b_.alt(std::move(alts));
  }
  if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>())
    node = b_.alt({node, b_.literal({"null" + end})});
  return node;
}

}  // namespace lily::structured
