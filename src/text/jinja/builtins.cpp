// jinja2's builtin filters and tests that chat templates use, with jinja2 3.1's semantics, and
// HF's tojson override (json.dumps, ensure_ascii=False, no key sorting, no HTML escaping).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "text/jinja/interp.h"
#include "text/jinja/parser.h"
#include "text/jinja/pystr.h"

namespace lily::jinja {
namespace {

using FilterFn = Value (*)(Interp&, const Value&, CallArgs&);
using TestFn = bool (*)(Interp&, const Value&, CallArgs&);

// Binds call arguments to a Python-style signature (positional then keyword), rejecting extras.
struct Sig {
  Sig(const CallArgs& a, const char* fname, std::initializer_list<const char*> names) : names_(names) {
    if (a.pos.size() > names_.size())
      throw Error(fmt::format("TypeError: {}() takes at most {} argument(s)", fname, names_.size()));
    vals_.resize(names_.size());
    for (size_t k = 0; k < a.pos.size(); ++k) vals_[k] = a.pos[k];
    for (auto& [key, v] : a.kw) {
      size_t k = 0;
      while (k < names_.size() && key != names_[k]) ++k;
      if (k == names_.size()) throw Error(fmt::format("TypeError: {}() got an unexpected keyword argument '{}'", fname, key));
      vals_[k] = v;
    }
  }
  bool has(size_t k) const { return vals_[k].has_value(); }
  Value get(size_t k, Value dflt) const { return vals_[k] ? *vals_[k] : dflt; }

 private:
  std::vector<const char*> names_;
  std::vector<std::optional<Value>> vals_;
};

std::string soft_str(const Value& v) { return py_str(v); }

// Results of jinja2's generator filters (items, map, select, reject, selectattr, rejectattr,
// unique, reverse of a sequence): truthy even when empty, no len(), not subscriptable.
Value generator(List items) {
  Value v = Value::from_list(std::move(items));
  v.is_iter = true;
  return v;
}

Value f_length(Interp&, const Value& v, CallArgs& a) {
  Sig(a, "length", {});
  switch (v.kind) {
    case Kind::Undefined: return Value::integer(0);
    case Kind::String: return Value::integer(static_cast<int64_t>(pystr::length(v.s)));
    case Kind::List:
      if (v.is_iter) break;
      return Value::integer(static_cast<int64_t>(v.list->size()));
    case Kind::Dict:
      if (!v.is_namespace) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      break;
    default: break;
  }
  throw Error("TypeError: object of type '" + type_name(v) + "' has no len()");
}

Value f_trim(Interp&, const Value& v, CallArgs& a) {
  Sig s(a, "trim", {"chars"});
  Value chars = s.get(0, Value::none());
  std::optional<std::string> set;
  if (!chars.is_none()) set = py_str(chars);
  return Value::string(pystr::strip(soft_str(v), set, true, true), v.safe);
}
Value f_string(Interp&, const Value& v, CallArgs& a) {
  Sig(a, "string", {});
  return v.is_string() ? v : Value::string(py_str(v));
}
Value f_safe(Interp&, const Value& v, CallArgs& a) {
  Sig(a, "safe", {});
  return Value::string(py_str(v), true);
}
Value f_escape(Interp&, const Value& v, CallArgs& a) {
  Sig(a, "escape", {});
  if (v.is_string() && v.safe) return v;
  return Value::string(pystr::html_escape(py_str(v)), true);
}
Value f_upper(Interp&, const Value& v, CallArgs& a) { Sig(a, "upper", {}); return Value::string(pystr::upper(soft_str(v))); }
Value f_lower(Interp&, const Value& v, CallArgs& a) { Sig(a, "lower", {}); return Value::string(pystr::lower(soft_str(v))); }
// jinja2's do_title (not str.title): words start after whitespace or any of - ( { [ <.
Value f_title(Interp&, const Value& v, CallArgs& a) {
  Sig(a, "title", {});
  std::u32string u = pystr::decode(soft_str(v));
  std::string out;
  bool word_start = true;
  for (char32_t c : u) {
    bool sep = pystr::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    std::string one;
    pystr::append_utf8(one, c);
    out += sep ? one : (word_start ? pystr::upper(one) : pystr::lower(one));
    word_start = sep;
  }
  return Value::string(out);
}
Value f_capitalize(Interp&, const Value& v, CallArgs& a) {
  Sig(a, "capitalize", {});
  return Value::string(pystr::capitalize(soft_str(v)));
}

Value f_replace(Interp&, const Value& v, CallArgs& a) {
  Sig s(a, "replace", {"old", "new", "count"});
  if (!s.has(0) || !s.has(1)) throw Error("TypeError: replace() needs old and new");
  Value count = s.get(2, Value::none());
  long n = count.is_none() ? -1 : static_cast<long>(count.as_int());
  return Value::string(pystr::replace(soft_str(v), py_str(s.get(0, {})), py_str(s.get(1, {})), n));
}

// Python int(str, base 10): optional sign, digits with single underscores, surrounding spaces.
std::optional<int64_t> parse_int(const std::string& text) {
  std::string t = pystr::strip(text, std::nullopt, true, true);
  size_t k = 0;
  bool neg = false;
  if (k < t.size() && (t[k] == '+' || t[k] == '-')) neg = t[k++] == '-';
  if (k >= t.size()) return std::nullopt;
  int64_t v = 0;
  bool prev_digit = false;
  for (; k < t.size(); ++k) {
    if (t[k] == '_' && prev_digit && k + 1 < t.size()) {
      prev_digit = false;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(t[k]))) return std::nullopt;
    // Past int64 (Python's ints are unbounded): not an int64 — int() then takes the float path,
    // which says OverflowError; an attribute path part is then a name.
    if (v > (std::numeric_limits<int64_t>::max() - (t[k] - '0')) / 10) return std::nullopt;
    v = v * 10 + (t[k] - '0');
    prev_digit = true;
  }
  if (!prev_digit) return std::nullopt;
  return neg ? -v : v;
}
// Python float(str): decimal digits (single underscores between digits), optional point and
// exponent, or inf/infinity/nan; no hex (strtod alone would accept "0x1A").
std::optional<double> parse_float(const std::string& text) {
  std::string raw = pystr::strip(text, std::nullopt, true, true);
  std::string t;
  for (size_t k = 0; k < raw.size(); ++k) {
    if (raw[k] == '_') {
      bool ok = k > 0 && k + 1 < raw.size() && std::isdigit(static_cast<unsigned char>(raw[k - 1])) &&
                std::isdigit(static_cast<unsigned char>(raw[k + 1]));
      if (!ok) return std::nullopt;
      continue;
    }
    t += raw[k];
  }
  size_t k = (!t.empty() && (t[0] == '+' || t[0] == '-')) ? 1 : 0;
  std::string word = pystr::lower(t.substr(k));
  if (word == "inf" || word == "infinity" || word == "nan") return std::strtod(t.c_str(), nullptr);
  size_t digits = 0;
  while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) ++k, ++digits;
  if (k < t.size() && t[k] == '.') {
    ++k;
    while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) ++k, ++digits;
  }
  if (digits == 0) return std::nullopt;
  if (k < t.size() && (t[k] == 'e' || t[k] == 'E')) {
    ++k;
    if (k < t.size() && (t[k] == '+' || t[k] == '-')) ++k;
    size_t exp_digits = 0;
    while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) ++k, ++exp_digits;
    if (exp_digits == 0) return std::nullopt;
  }
  if (k != t.size()) return std::nullopt;
  char* end = nullptr;
  double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

// A float's integer part as int64 (Python's ints are unbounded; ours stop at int64).
int64_t float_to_int(double d) {
  if (!std::isfinite(d)) throw Error("OverflowError: cannot convert float infinity or NaN to integer");
  const double t = std::trunc(d);
  if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0))
    throw Error("OverflowError: integer out of the 64-bit range");
  return static_cast<int64_t>(t);
}

Value f_int(Interp&, const Value& v, CallArgs& a) {
  Sig s(a, "int", {"default", "base"});
  Value dflt = s.get(0, Value::integer(0));
  if (s.has(1) && s.get(1, {}).as_int() != 10) throw Error("unsupported: int filter with base != 10");
  switch (v.kind) {
    case Kind::Undefined: fail_undefined(v);
    case Kind::Bool:
    case Kind::Int: return Value::integer(v.as_int());
    case Kind::Float: return Value::integer(float_to_int(v.f));
    case Kind::String: {
      if (auto i = parse_int(v.s)) return Value::integer(*i);
      if (auto d = parse_float(v.s)) return Value::integer(float_to_int(*d));
      return dflt;
    }
    default: return dflt;
  }
}
Value f_float(Interp&, const Value& v, CallArgs& a) {
  Sig s(a, "float", {"default"});
  Value dflt = s.get(0, Value::real(0.0));
  switch (v.kind) {
    case Kind::Undefined: fail_undefined(v);
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float: return Value::real(v.as_double());
    case Kind::String:
      if (auto d = parse_float(v.s)) return Value::real(*d);
      return dflt;
    default: return dflt;
  }
}

Value f_list(Interp& in, const Value& v, CallArgs& a) {
  Sig(a, "list", {});
  return Value::from_list(in.iterate(v));
}
Value f_items(Interp&, const Value& v, CallArgs& a) {
  Sig(a, "items", {});
  if (v.is_undefined()) return generator({});
  if (!v.is_dict() || v.is_namespace) throw Error("TypeError: Can only get item pairs from a mapping.");
  List out;
  for (auto& [k, x] : v.dict->items) out.push_back(Value::from_list({Value::string(k), x}, true));
  return generator(std::move(out));
}

// attribute="a.b" or integer index, as jinja2's make_attrgetter resolves it.
Value get_path(Interp& in, const Value& v, const Value& attr) {
  if (attr.is_int_like()) return in.get_item(v, attr);
  Value cur = v;
  for (auto& part : pystr::split(py_str(attr), std::string("."), -1)) {
    auto i = parse_int(part);
    cur = i && !part.empty() && std::isdigit(static_cast<unsigned char>(part[0])) ? in.get_item(cur, Value::integer(*i))
                                                                                  : in.get_item(cur, Value::string(part));
  }
  return cur;
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  Sig s(a, "join", {"d", "attribute"});
  std::string sep = py_str(s.get(0, Value::string("")));
  Value attr = s.get(1, Value::none());
  std::string out;
  bool first = true;
  for (auto& x : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += py_str(attr.is_none() ? x : get_path(in, x, attr));
  }
  return Value::string(out);
}

Value f_default(Interp&, const Value& v, CallArgs& a) {
  Sig s(a, "default", {"default_value", "boolean"});
  Value dflt = s.get(0, Value::string(""));
  bool boolean = truthy(s.get(1, Value::boolean(false)));
  if (v.is_undefined() || (boolean && !truthy(v))) return dflt;
  return v;
}

Value f_first(Interp& in, const Value& v, CallArgs& a) {
  Sig(a, "first", {});
  auto items = in.iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}
Value f_last(Interp& in, const Value& v, CallArgs& a) {
  Sig(a, "last", {});
  if (v.is_list() && v.is_iter) throw Error("TypeError: 'generator' object is not reversible");
  auto items = in.iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}
Value f_reverse(Interp& in, const Value& v, CallArgs& a) {
  Sig(a, "reverse", {});
  if (v.is_string()) {
    std::u32string u = pystr::decode(v.s);
    std::reverse(u.begin(), u.end());
    return Value::string(pystr::encode(u));
  }
  auto items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return generator(std::move(items));
}

Value f_tojson(Interp&, const Value& v, CallArgs& a) {
  Sig s(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = truthy(s.get(0, Value::boolean(false)));
  Value indent = s.get(1, Value::none());
  if (indent.is_int_like() && indent.as_int() > 1024) throw Error("unsupported: tojson indent over 1024");
  if (indent.is_int_like()) o.indent = static_cast<int>(std::max<int64_t>(0, indent.as_int()));
  else if (!indent.is_none()) throw Error("unsupported: tojson indent must be an integer");
  Value seps = s.get(2, Value::none());
  if (seps.is_list() && seps.list->size() == 2) {
    o.item_sep = py_str((*seps.list)[0]);
    o.key_sep = py_str((*seps.list)[1]);
    if (o.item_sep.empty() || o.key_sep.empty()) throw Error("unsupported: empty tojson separators");
  }
  o.sort_keys = truthy(s.get(3, Value::boolean(false)));
  return Value::string(json_dumps(v, o));
}

// Sort key for sort/unique/min/max: the value, lower-cased for strings unless case_sensitive.
Value sort_key(Interp& in, const Value& v, const Value& attr, bool case_sensitive) {
  Value k = attr.is_none() ? v : get_path(in, v, attr);
  if (!case_sensitive && k.is_string()) return Value::string(pystr::lower(k.s));
  return k;
}
Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  Sig s(a, "sort", {"reverse", "case_sensitive", "attribute"});
  bool rev = truthy(s.get(0, Value::boolean(false))), cs = truthy(s.get(1, Value::boolean(false)));
  Value attr = s.get(2, Value::none());
  auto items = in.iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& x : items) keyed.emplace_back(sort_key(in, x, attr, cs), x);
  std::stable_sort(keyed.begin(), keyed.end(), [&](auto& p, auto& q) {
    return rev ? py_compare(q.first, p.first) < 0 : py_compare(p.first, q.first) < 0;
  });
  List out;
  for (auto& p : keyed) out.push_back(p.second);
  return Value::from_list(std::move(out));
}
Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  Sig s(a, "unique", {"case_sensitive", "attribute"});
  bool cs = truthy(s.get(0, Value::boolean(false)));
  Value attr = s.get(1, Value::none());
  List out, seen;
  for (auto& x : in.iterate(v)) {
    Value k = sort_key(in, x, attr, cs);
    if ((k.is_list() && !k.is_tuple) || k.is_dict())
      throw Error(fmt::format("TypeError: unhashable type: '{}'", type_name(k)));
    bool dup = false;
    for (auto& y : seen) dup |= py_equal(k, y);
    if (!dup) seen.push_back(k), out.push_back(x);
  }
  return generator(std::move(out));
}
Value minmax(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  Sig s(a, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  bool cs = truthy(s.get(0, Value::boolean(false)));
  Value attr = s.get(1, Value::none());
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined(want_max ? "No aggregated item, sequence was empty." : "No aggregated item, sequence was empty.");
  size_t best = 0;
  for (size_t k = 1; k < items.size(); ++k) {
    int c = py_compare(sort_key(in, items[k], attr, cs), sort_key(in, items[best], attr, cs));
    if (want_max ? c > 0 : c < 0) best = k;
  }
  return items[best];
}
Value f_min(Interp& in, const Value& v, CallArgs& a) { return minmax(in, v, a, false); }
Value f_max(Interp& in, const Value& v, CallArgs& a) { return minmax(in, v, a, true); }
Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  Sig s(a, "sum", {"attribute", "start"});
  Value attr = s.get(0, Value::none());
  Value total = s.get(1, Value::integer(0));
  for (auto& x : in.iterate(v)) total = binary_op("+", total, attr.is_none() ? x : get_path(in, x, attr));
  return total;
}
Value f_abs(Interp&, const Value& v, CallArgs& a) {
  Sig(a, "abs", {});
  if (v.kind == Kind::Float) return Value::real(std::fabs(v.f));
  if (v.is_int_like()) {
    if (v.as_int() == std::numeric_limits<int64_t>::min()) throw Error("OverflowError: integer out of the 64-bit range");
    return Value::integer(std::llabs(v.as_int()));
  }
  throw Error("TypeError: bad operand type for abs(): '" + type_name(v) + "'");
}
Value f_round(Interp&, const Value& v, CallArgs& a) {
  Sig s(a, "round", {"precision", "method"});
  int64_t prec = s.get(0, Value::integer(0)).as_int();
  std::string method = py_str(s.get(1, Value::string("common")));
  if (!v.is_number()) throw Error("TypeError: round() needs a number");
  double x = v.as_double(), m = std::pow(10.0, static_cast<double>(prec));
  double r;
  if (method == "common") r = std::nearbyint(x * m) / m;  // Python round(): half to even
  else if (method == "ceil") r = std::ceil(x * m) / m;
  else if (method == "floor") r = std::floor(x * m) / m;
  else throw Error("FilterArgumentError: method must be common, ceil or floor");
  if (v.is_int_like() && method == "common") return Value::integer(float_to_int(r));
  return Value::real(r);
}
Value f_indent(Interp&, const Value& v, CallArgs& a) {
  Sig s(a, "indent", {"width", "first", "blank"});
  Value w = s.get(0, Value::integer(4));
  if (!w.is_string()) check_size(size_t(std::clamp<int64_t>(w.as_int(), 0, int64_t(limits.max_string_bytes) + 1)));
  std::string ind = w.is_string() ? w.s : std::string(static_cast<size_t>(std::max<int64_t>(0, w.as_int())), ' ');
  bool first = truthy(s.get(1, Value::boolean(false))), blank = truthy(s.get(2, Value::boolean(false)));
  if (!v.is_string()) binary_op("+", v, Value::string("\n"));  // jinja2 does s += "\n": non-str fails
  auto lines = pystr::splitlines(v.s + "\n", false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind + lines[k]);
  }
  if (first) rv = ind + rv;
  return Value::string(rv);
}
Value f_attr(Interp&, const Value& v, CallArgs& a) {
  // getattr only (no item fallback): a dict's keys are not attributes.
  Sig s(a, "attr", {"name"});
  std::string name = py_str(s.get(0, Value::string("")));
  if (v.is_undefined()) fail_undefined(v);
  Value m = bound_method(v, name);
  if (!m.is_undefined()) return m;
  if (v.is_dict() && v.is_namespace)
    if (const Value* x = v.dict->find(name)) return *x;
  return Value::undefined(fmt::format("'{}' object has no attribute '{}'", type_name(v), name));
}
Value f_format(Interp&, const Value& v, CallArgs& a) {
  if (!a.kw.empty() && !a.pos.empty()) throw Error("FilterArgumentError: can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    Dict d;
    for (auto& [k, x] : a.kw) d.set(k, x);
    return Value::string(percent_format(py_str(v), Value::from_dict(std::move(d))));
  }
  return Value::string(percent_format(py_str(v), Value::from_list(a.pos, true)));
}
Value f_dictsort(Interp& in, const Value& v, CallArgs& a) {
  Sig s(a, "dictsort", {"case_sensitive", "by", "reverse"});
  bool cs = truthy(s.get(0, Value::boolean(false)));
  std::string by = py_str(s.get(1, Value::string("key")));
  bool rev = truthy(s.get(2, Value::boolean(false)));
  CallArgs none;
  Value items = f_items(in, v, none);
  items.is_iter = false;  // sorted() gives a list
  auto& lst = *items.list;
  size_t pos = by == "value" ? 1 : 0;
  std::stable_sort(lst.begin(), lst.end(), [&](const Value& p, const Value& q) {
    Value kp = sort_key(in, (*p.list)[pos], Value::none(), cs), kq = sort_key(in, (*q.list)[pos], Value::none(), cs);
    return rev ? py_compare(kq, kp) < 0 : py_compare(kp, kq) < 0;
  });
  return items;
}

// select/reject/selectattr/rejectattr/map share jinja2's argument conventions.
// jinja2 guards these with `if value:`, so a falsy non-iterable (none, 0, false) yields nothing.
Value select_impl(Interp& in, const Value& v, CallArgs& a, bool attr_mode, bool want) {
  if (!truthy(v)) return generator({});
  std::vector<Value> rest = a.pos;
  Value attr;
  if (attr_mode) {
    if (rest.empty()) throw Error("TypeError: missing attribute for selectattr/rejectattr");
    attr = rest.front();
    rest.erase(rest.begin());
  }
  std::optional<std::string> test;
  if (!rest.empty()) {
    test = py_str(rest.front());
    rest.erase(rest.begin());
    if (!has_test(*test)) throw Error("TemplateRuntimeError: No test named '" + *test + "'");
  }
  List out;
  for (auto& x : in.iterate(v)) {
    Value subject = attr_mode ? get_path(in, x, attr) : x;
    bool ok;
    if (test) {
      CallArgs ta;
      ta.pos = rest;
      ta.kw = a.kw;
      ok = in.apply_test(*test, subject, ta);
    } else {
      ok = truthy(subject);
    }
    if (ok == want) out.push_back(x);
  }
  return generator(std::move(out));
}
Value f_select(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }
Value f_map(Interp& in, const Value& v, CallArgs& a) {
  List out;
  if (!truthy(v)) return generator({});
  const Value* attr = nullptr;
  const Value* dflt = nullptr;
  for (auto& [k, x] : a.kw) {
    if (k == "attribute") attr = &x;
    else if (k == "default") dflt = &x;
  }
  if (attr) {
    for (auto& x : in.iterate(v)) {
      Value r = get_path(in, x, *attr);
      out.push_back(r.is_undefined() && dflt ? *dflt : r);
    }
    return generator(std::move(out));
  }
  if (a.pos.empty()) throw Error("TypeError: map requires a filter argument");
  std::string name = py_str(a.pos[0]);
  if (!has_filter(name)) throw Error("TemplateRuntimeError: No filter named '" + name + "'");
  CallArgs fa;
  fa.pos.assign(a.pos.begin() + 1, a.pos.end());
  fa.kw = a.kw;
  for (auto& x : in.iterate(v)) out.push_back(in.apply_filter(name, x, fa));
  return generator(std::move(out));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"length", f_length}, {"count", f_length}, {"trim", f_trim}, {"string", f_string}, {"safe", f_safe},
      {"escape", f_escape}, {"e", f_escape}, {"upper", f_upper}, {"lower", f_lower}, {"title", f_title},
      {"capitalize", f_capitalize}, {"replace", f_replace}, {"int", f_int}, {"float", f_float},
      {"list", f_list}, {"items", f_items}, {"join", f_join}, {"default", f_default}, {"d", f_default},
      {"first", f_first}, {"last", f_last}, {"reverse", f_reverse}, {"tojson", f_tojson}, {"sort", f_sort},
      {"unique", f_unique}, {"min", f_min}, {"max", f_max}, {"sum", f_sum}, {"abs", f_abs}, {"round", f_round},
      {"indent", f_indent}, {"attr", f_attr}, {"format", f_format}, {"dictsort", f_dictsort},
      {"select", f_select}, {"reject", f_reject}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr},
      {"map", f_map},
  };
  return m;
}

// ---- tests ----
Value one_arg(const CallArgs& a, const char* name) {
  if (a.pos.size() != 1 || !a.kw.empty()) throw Error(fmt::format("TypeError: test '{}' takes one argument", name));
  return a.pos[0];
}
bool t_defined(Interp&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interp&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_string(Interp&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Interp&, const Value& v, CallArgs&) { return v.is_dict() && !v.is_namespace; }
bool t_iterable(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || (v.is_dict() && !v.is_namespace);
}
bool t_sequence(Interp& in, const Value& v, CallArgs& a) { return !(v.is_list() && v.is_iter) && t_iterable(in, v, a); }
bool t_number(Interp&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_integer(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::Int; }
bool t_float(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::Float; }
bool t_boolean(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::Bool; }
bool t_true(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::Bool && v.b; }
bool t_false(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::Bool && !v.b; }
// Undefined defines __call__ (to fail), so Python's callable() says yes.
bool t_callable(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::Callable || v.is_undefined(); }
bool t_eq(Interp&, const Value& v, CallArgs& a) { return py_equal(v, one_arg(a, "eq")); }
bool t_ne(Interp&, const Value& v, CallArgs& a) { return !py_equal(v, one_arg(a, "ne")); }
bool t_lt(Interp&, const Value& v, CallArgs& a) { return py_compare(v, one_arg(a, "lt")) < 0; }
bool t_le(Interp&, const Value& v, CallArgs& a) { return py_compare(v, one_arg(a, "le")) <= 0; }
bool t_gt(Interp&, const Value& v, CallArgs& a) { return py_compare(v, one_arg(a, "gt")) > 0; }
bool t_ge(Interp&, const Value& v, CallArgs& a) { return py_compare(v, one_arg(a, "ge")) >= 0; }
bool t_in(Interp&, const Value& v, CallArgs& a) { return contains(one_arg(a, "in"), v); }
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  Value o = one_arg(a, "sameas");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::None: return true;
    case Kind::Bool: return v.b == o.b;
    case Kind::Int: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's small-int cache
    case Kind::List: return v.list == o.list;
    case Kind::Dict: return v.dict == o.dict;
    case Kind::Callable: return v.fn == o.fn;
    default: return false;
  }
}
// jinja2: value % 2 == 1, value % 2 == 0, value % num == 0 (Python modulo, floats too).
bool t_odd(Interp&, const Value& v, CallArgs&) { return py_equal(binary_op("%", v, Value::integer(2)), Value::integer(1)); }
bool t_even(Interp&, const Value& v, CallArgs&) { return py_equal(binary_op("%", v, Value::integer(2)), Value::integer(0)); }
bool t_divisibleby(Interp&, const Value& v, CallArgs& a) {
  return py_equal(binary_op("%", v, one_arg(a, "divisibleby")), Value::integer(0));
}
// str.islower() / str.isupper(): at least one cased character and none of the other case.
bool case_test(const Value& v, bool want_lower) {
  bool any = false;
  for (char32_t c : pystr::decode(py_str(v))) {
    if (want_lower ? pystr::is_upper(c) : pystr::is_lower(c)) return false;
    any |= pystr::is_upper(c) || pystr::is_lower(c);
  }
  return any;
}
bool t_lower(Interp&, const Value& v, CallArgs&) { return case_test(v, true); }
bool t_upper(Interp&, const Value& v, CallArgs&) { return case_test(v, false); }
bool t_escaped(Interp&, const Value& v, CallArgs&) { return v.is_string() && v.safe; }
bool t_filter(Interp&, const Value& v, CallArgs&) { return v.is_string() && filters().count(v.s) > 0; }
bool t_test(Interp&, const Value& v, CallArgs&) { return v.is_string() && has_test(v.s); }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"string", t_string},
      {"mapping", t_mapping}, {"iterable", t_iterable}, {"sequence", t_sequence}, {"number", t_number},
      {"integer", t_integer}, {"float", t_float}, {"boolean", t_boolean}, {"true", t_true}, {"false", t_false},
      {"callable", t_callable}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne},
      {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt},
      {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"sameas", t_sameas},
      {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby}, {"lower", t_lower}, {"upper", t_upper},
      {"escaped", t_escaped}, {"filter", t_filter}, {"test", t_test},
  };
  return m;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }
bool has_test(const std::string& name) { return tests().count(name) > 0; }

Value call_filter(Interp& in, const std::string& name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw Error("TemplateRuntimeError: No filter named '" + name + "'");
  return it->second(in, input, args);
}
bool call_test(Interp& in, const std::string& name, const Value& input, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw Error("TemplateRuntimeError: No test named '" + name + "'");
  return it->second(in, input, args);
}

}  // namespace lily::jinja
