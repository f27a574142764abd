// Python methods callable from templates (str.startswith, str.split, dict.items, dict.get, ...)
// and the globals HF exposes (raise_exception, strftime_now) plus jinja2's (range, namespace, dict).
// Mutating methods (list.append, dict.update) are absent: HF's ImmutableSandboxedEnvironment
// refuses them too.
#include <ctime>

#include <fmt/format.h>

#include "text/jinja/interp.h"
#include "text/jinja/pystr.h"

namespace lily::jinja {
namespace {

// Positional-or-keyword argument k named `name`, or nullopt.
std::optional<Value> arg(const CallArgs& a, size_t k, const char* name) {
  if (k < a.pos.size()) return a.pos[k];
  for (auto& [key, v] : a.kw)
    if (key == name) return v;
  return std::nullopt;
}
void max_args(const CallArgs& a, size_t n, const std::string& fname) {
  if (a.pos.size() + a.kw.size() > n)
    throw Error(fmt::format("TypeError: {}() takes at most {} argument(s) ({} given)", fname, n, a.pos.size() + a.kw.size()));
}
const std::string& str_arg(const Value& v, const std::string& fname) {
  if (!v.is_string()) throw Error(fmt::format("TypeError: {}() argument must be str, not {}", fname, type_name(v)));
  return v.s;
}
std::optional<std::string> opt_str(const std::optional<Value>& v, const std::string& fname) {
  if (!v || v->is_none()) return std::nullopt;
  return str_arg(*v, fname);
}
long opt_int(const std::optional<Value>& v, long dflt) {
  if (!v || v->is_none()) return dflt;
  if (!v->is_int_like()) throw Error("TypeError: an integer is required, not " + type_name(*v));
  return static_cast<long>(v->as_int());
}
Value str_list(const std::vector<std::string>& parts) {
  List out;
  for (auto& p : parts) out.push_back(Value::string(p));
  return Value::from_list(std::move(out));
}

bool affix_test(const std::string& s, const Value& a, bool start, const std::string& fname) {
  if (a.is_list() && a.is_tuple) {
    for (auto& x : *a.list)
      if (start ? pystr::starts_with(s, str_arg(x, fname)) : pystr::ends_with(s, str_arg(x, fname))) return true;
    return false;
  }
  if (!a.is_string())
    throw Error(fmt::format("TypeError: {} first arg must be str or a tuple of str, not {}", fname, type_name(a)));
  return start ? pystr::starts_with(s, a.s) : pystr::ends_with(s, a.s);
}

std::string str_format(const std::string& f, const CallArgs& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t k = 0; k < f.size(); ++k) {
    char c = f[k];
    if (c == '}') {
      if (k + 1 < f.size() && f[k + 1] == '}') ++k;
      else throw Error("ValueError: Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (k + 1 < f.size() && f[k + 1] == '{') {
      out += '{';
      ++k;
      continue;
    }
    size_t e = f.find('}', k);
    if (e == std::string::npos) throw Error("ValueError: Single '{' encountered in format string");
    std::string field = f.substr(k + 1, e - k - 1);
    if (field.find_first_of(":!.[") != std::string::npos) throw Error("unsupported: str.format field '" + field + "'");
    const Value* v = nullptr;
    if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
      size_t idx = field.empty() ? auto_idx++ : std::stoul(field);
      if (idx >= a.pos.size()) throw Error("IndexError: Replacement index " + std::to_string(idx) + " out of range");
      v = &a.pos[idx];
    } else {
      for (auto& [key, x] : a.kw)
        if (key == field) v = &x;
      if (!v) throw Error("KeyError: '" + field + "'");
    }
    out += py_str(*v);
    k = e;
  }
  return out;
}

Value string_method(const Value& obj, const std::string& name) {
  static const char* kNames[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit",
                                 "splitlines", "replace", "upper", "lower", "title", "capitalize", "find",
                                 "rfind", "index", "count", "join", "format", "isdigit", "isalpha", "isalnum",
                                 "isspace", "islower", "isupper", "removeprefix", "removesuffix"};
  bool known = false;
  for (const char* n : kNames) known |= name == n;
  if (!known) return Value::undefined();
  std::string s = obj.s;
  return Value::callable("str." + name, [s, name](Interp& in, CallArgs& a) -> Value {
    if (name == "startswith" || name == "endswith") {
      max_args(a, 1, name);
      if (a.pos.empty()) throw Error("TypeError: " + name + "() takes at least 1 argument");
      return Value::boolean(affix_test(s, a.pos[0], name == "startswith", name));
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      max_args(a, 1, name);
      return Value::string(pystr::strip(s, opt_str(arg(a, 0, "chars"), name), name != "rstrip", name != "lstrip"));
    }
    if (name == "split" || name == "rsplit") {
      max_args(a, 2, name);
      auto sep = opt_str(arg(a, 0, "sep"), name);
      long maxsplit = opt_int(arg(a, 1, "maxsplit"), -1);
      return str_list(name == "split" ? pystr::split(s, sep, maxsplit) : pystr::rsplit(s, sep, maxsplit));
    }
    if (name == "splitlines") {
      max_args(a, 1, name);
      auto keep = arg(a, 0, "keepends");
      return str_list(pystr::splitlines(s, keep && truthy(*keep)));
    }
    if (name == "replace") {
      max_args(a, 3, name);
      if (a.pos.size() < 2) throw Error("TypeError: replace expected at least 2 arguments");
      return Value::string(pystr::replace(s, str_arg(a.pos[0], name), str_arg(a.pos[1], name), opt_int(arg(a, 2, "count"), -1)));
    }
    if (name == "upper") return Value::string(pystr::upper(s));
    if (name == "lower") return Value::string(pystr::lower(s));
    if (name == "title") return Value::string(pystr::title(s));
    if (name == "capitalize") return Value::string(pystr::capitalize(s));
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
      if (a.pos.size() != 1 || !a.kw.empty()) throw Error("unsupported: " + name + "() with start/end arguments");
      const std::string& sub = str_arg(a.pos[0], name);
      if (name == "count") return Value::integer(pystr::count(s, sub));
      long r = pystr::find(s, sub, name == "rfind");
      if (name == "index" && r < 0) throw Error("ValueError: substring not found");
      return Value::integer(r);
    }
    if (name == "join") {
      max_args(a, 1, name);
      if (a.pos.empty()) throw Error("TypeError: join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (auto& x : in.iterate(a.pos[0])) {
        if (!first) out += s;
        first = false;
        if (!x.is_string()) throw Error("TypeError: sequence item: expected str instance, " + type_name(x) + " found");
        out += x.s;
      }
      return Value::string(out);
    }
    if (name == "format") return Value::string(str_format(s, a));
    if (name == "removeprefix" || name == "removesuffix") {
      max_args(a, 1, name);
      if (a.pos.empty()) throw Error("TypeError: " + name + "() takes exactly one argument");
      const std::string& x = str_arg(a.pos[0], name);
      if (name == "removeprefix") return Value::string(pystr::starts_with(s, x) ? s.substr(x.size()) : s);
      return Value::string(pystr::ends_with(s, x) ? s.substr(0, s.size() - x.size()) : s);
    }
    // is* predicates: false on the empty string; islower/isupper need at least one cased char.
    std::u32string u = pystr::decode(s);
    if (u.empty()) return Value::boolean(false);
    if (name == "islower" || name == "isupper") {
      bool any = false;
      for (char32_t c : u) {
        if (name == "islower" ? pystr::is_upper(c) : pystr::is_lower(c)) return Value::boolean(false);
        any |= pystr::is_upper(c) || pystr::is_lower(c);
      }
      return Value::boolean(any);
    }
    for (char32_t c : u) {
      bool ok = name == "isdigit"   ? pystr::is_digit(c)
                : name == "isalpha" ? pystr::is_alpha(c)
                : name == "isalnum" ? (pystr::is_alpha(c) || pystr::is_digit(c))
                                    : pystr::is_space(c);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  });
}

Value dict_method(const Value& obj, const std::string& name) {
  if (name != "items" && name != "keys" && name != "values" && name != "get") return Value::undefined();
  auto d = obj.dict;
  return Value::callable("dict." + name, [d, name](Interp&, CallArgs& a) -> Value {
    if (name == "get") {
      if (a.pos.empty() || a.pos.size() > 2 || !a.kw.empty()) throw Error("TypeError: get expected 1 or 2 arguments");
      if (a.pos[0].is_string())
        if (const Value* v = d->find(a.pos[0].s)) return *v;
      return a.pos.size() > 1 ? a.pos[1] : Value::none();
    }
    if (!a.pos.empty() || !a.kw.empty()) throw Error("TypeError: " + name + "() takes no arguments");
    List out;
    for (auto& [k, v] : d->items) {
      if (name == "items") out.push_back(Value::from_list({Value::string(k), v}, true));
      else if (name == "keys") out.push_back(Value::string(k));
      else out.push_back(v);
    }
    return Value::from_list(std::move(out));
  });
}

}  // namespace

Value bound_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj, name);
  if (obj.is_dict() && !obj.is_namespace) return dict_method(obj, name);
  return Value::undefined();
}

void add_globals(Frame& f) {
  f.vars["raise_exception"] = Value::callable("raise_exception", [](Interp&, CallArgs& a) -> Value {
    Error e(a.pos.empty() ? std::string() : py_str(a.pos[0]));
    e.raised = true;
    throw e;
  });
  f.vars["strftime_now"] = Value::callable("strftime_now", [](Interp&, CallArgs& a) -> Value {
    if (a.pos.size() != 1 || !a.pos[0].is_string()) throw Error("TypeError: strftime_now(format) needs one string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
  f.vars["namespace"] = Value::callable("namespace", [](Interp&, CallArgs& a) -> Value {
    Dict d;
    for (auto& p : a.pos) {
      if (!p.is_dict()) throw Error("TypeError: namespace() positional argument must be a mapping");
      for (auto& kv : p.dict->items) d.set(kv.first, kv.second);
    }
    for (auto& [k, v] : a.kw) d.set(k, v);
    Value ns = Value::from_dict(std::move(d));
    ns.is_namespace = true;
    return ns;
  });
  f.vars["dict"] = Value::callable("dict", [](Interp&, CallArgs& a) -> Value {
    Dict d;
    for (auto& p : a.pos) {
      if (!p.is_dict()) throw Error("unsupported: dict() from a non-mapping");
      for (auto& kv : p.dict->items) d.set(kv.first, kv.second);
    }
    for (auto& [k, v] : a.kw) d.set(k, v);
    return Value::from_dict(std::move(d));
  });
  f.vars["range"] = Value::callable("range", [](Interp&, CallArgs& a) -> Value {
    if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) throw Error("TypeError: range expected 1 to 3 arguments");
    for (auto& p : a.pos)
      if (!p.is_int_like()) throw Error("TypeError: '" + type_name(p) + "' object cannot be interpreted as an integer");
    int64_t start = a.pos.size() > 1 ? a.pos[0].as_int() : 0;
    int64_t stop = a.pos.size() > 1 ? a.pos[1].as_int() : a.pos[0].as_int();
    int64_t step = a.pos.size() > 2 ? a.pos[2].as_int() : 1;
    if (step == 0) throw Error("ValueError: range() arg 3 must not be zero");
    List out;
    // jinja2's MAX_RANGE, or less where lily's render budget is smaller (a range it could not
    // iterate anyway); k += step stops before it would overflow.
    const size_t max_range = size_t(std::min<int64_t>(100000, limits.max_render_steps));
    for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
      if (out.size() >= max_range)
        throw Error(fmt::format("OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).",
                                max_range));
      out.push_back(Value::integer(k));
      if (__builtin_add_overflow(k, step, &k)) break;
    }
    return Value::from_list(std::move(out));
  });
}

}  // namespace lily::jinja
