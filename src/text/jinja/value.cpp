// Python object semantics for jinja::Value: truthiness, str/repr, equality and ordering, float
// repr, and json.dumps byte for byte (HF's tojson is json.dumps with ensure_ascii=False).
#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>
#include <utf8proc.h>

#include "text/jinja/pystr.h"

namespace lily::jinja {

namespace {
// The containers waiting to be freed by the outermost release_nested on this thread's stack (null: none
// running). A plain pointer: nothing of it outlives that call or needs destroying at thread exit.
struct Releasing {
  std::vector<std::shared_ptr<List>> lists;
  std::vector<std::shared_ptr<Dict>> dicts;
};
thread_local Releasing* releasing = nullptr;

bool holds_containers(const List& l) {
  return std::any_of(l.begin(), l.end(), [](const Value& v) { return v.list || v.dict; });
}
bool holds_containers(const Dict& d) {
  return std::any_of(d.items.begin(), d.items.end(), [](const auto& kv) { return kv.second.list || kv.second.dict; });
}
}  // namespace

// Freeing a container destroys its values, whose destructors would free their own containers, and so on
// as deep as the nesting. Instead each destructor hands its sole-owned containers to the outermost call,
// which frees them one at a time, each container's values only adding to its list.
void Value::release_nested() noexcept {
  const bool own_list = list && list.use_count() == 1, own_dict = dict && dict.use_count() == 1;
  auto hand_over = [&](Releasing& r) {
    if (own_list) r.lists.push_back(std::move(list));
    if (own_dict) r.dicts.push_back(std::move(dict));
  };
  if (releasing) {
    hand_over(*releasing);
    return;
  }
  // A container of plain values frees without recursion as it is (most of a chat template's lists).
  if (!(own_list && holds_containers(*list)) && !(own_dict && holds_containers(*dict))) return;
  Releasing r;
  hand_over(r);
  releasing = &r;
  auto free_last = [](auto& v) {  // the container leaves the list before its values add to it
    auto c = std::move(v.back());
    v.pop_back();
    c.reset();
  };
  while (!r.lists.empty() || !r.dicts.empty()) {
    if (!r.lists.empty()) free_last(r.lists);
    else free_last(r.dicts);
  }
  releasing = nullptr;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) throw Error("integer too large: " + j.dump());
      return integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (auto& e : j) items.push_back(from_json(e));
      return from_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (auto& [k, v] : j.items()) d.items.emplace_back(k, from_json(v));
      return from_dict(std::move(d));
    }
    default: throw Error("unsupported JSON value");
  }
}

void fail_undefined(const Value& v) {
  throw Error("UndefinedError: " + (v.s.empty() ? std::string("value is undefined") : v.s));
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.b;
    case Kind::Int: return v.i != 0;
    case Kind::Float: return v.f != 0.0;
    case Kind::String: return !v.s.empty();
    case Kind::List: return v.is_iter || !v.list->empty();
    case Kind::Dict: return v.is_namespace || !v.dict->items.empty();
    case Kind::Callable: return true;
  }
  return false;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. -1.2345e+08
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t epos = sci.find('e');
  int exp10 = std::stoi(sci.substr(epos + 1));
  std::string digits;
  for (size_t k = 0; k < epos; ++k)
    if (sci[k] != '.') digits += sci[k];
  std::string out = neg ? "-" : "";
  int decpt = exp10 + 1;  // value = 0.digits * 10^decpt
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out;
}

static std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : pystr::decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
    } else if (c >= 0x80) {
      auto cat = utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->category;
      bool printable = !(cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CS ||
                         cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_ZL ||
                         cat == UTF8PROC_CATEGORY_ZP || cat == UTF8PROC_CATEGORY_ZS);
      if (printable) pystr::append_utf8(out, c);
      else if (c <= 0xff) out += fmt::format("\\x{:02x}", static_cast<unsigned>(c));
      else if (c <= 0xffff) out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
      else out += fmt::format("\\U{:08x}", static_cast<unsigned>(c));
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

namespace {
// Python's recursion limit, for the functions below that recurse into lists and dicts: a namespace may be
// assigned into itself (`{% set ns.s = ns %}`) or grow a nesting as deep as a loop runs
// (`{% set ns.x = [ns.x] %}`), and an unbounded recursion here overflowed the stack (jinja_fuzz).
constexpr int kMaxNesting = 900;
thread_local int nesting = 0;
// The containers whose repr is being written (Python's Py_ReprEnter): met again, they print as
// [...] / {...}, as Python's list and dict repr do.
thread_local std::vector<const void*> repr_active;
struct Nest {
  explicit Nest(const char* what) {
    if (++nesting > kMaxNesting) {
      --nesting;
      throw Error(std::string("RecursionError: maximum recursion depth exceeded ") + what);
    }
  }
  ~Nest() { --nesting; }
  Nest(const Nest&) = delete;
  Nest& operator=(const Nest&) = delete;
};
struct ReprEnter {
  explicit ReprEnter(const void* p) : again(std::find(repr_active.begin(), repr_active.end(), p) != repr_active.end()) {
    if (!again) repr_active.push_back(p);
  }
  ~ReprEnter() {
    if (!again) repr_active.pop_back();
  }
  ReprEnter(const ReprEnter&) = delete;
  ReprEnter& operator=(const ReprEnter&) = delete;
  const bool again;
};
}  // namespace

std::string py_repr(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::String: return repr_string(v.s);
    case Kind::List: {
      if (v.is_iter) return "<generator object>";
      Nest nest("while getting the repr of an object");
      ReprEnter enter(v.list.get());
      if (enter.again) return v.is_tuple ? "(...)" : "[...]";
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += py_repr((*v.list)[k]);
      }
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Kind::Dict: {
      Nest nest("while getting the repr of an object");
      ReprEnter enter(v.dict.get());
      if (enter.again) return v.is_namespace ? "<Namespace {...}>" : "{...}";
      std::string out = v.is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (auto& [k, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": " + py_repr(x);
      }
      return out + (v.is_namespace ? "}>" : "}");
    }
    default: return py_str(v);
  }
}

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return v.b ? "True" : "False";
    case Kind::Int: return std::to_string(v.i);
    case Kind::Float: return float_repr(v.f);
    case Kind::String: return v.s;
    case Kind::Callable: return "<function " + v.fn->name + ">";
    default: return py_repr(v);
  }
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.is_iter ? "generator" : v.is_tuple ? "tuple" : "list";
    case Kind::Dict: return v.is_namespace ? "Namespace" : "dict";
    case Kind::Callable: return "function";
  }
  return "object";
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  Nest nest("in comparison");
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::None: return true;
    case Kind::String: return a.s == b.s;
    case Kind::List: {
      if (a.is_iter || b.is_iter) return a.list == b.list;
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!py_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.is_namespace || b.is_namespace) return a.dict == b.dict;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !py_equal(x, *y)) return false;
      }
      return true;
    }
    case Kind::Callable: return a.fn == b.fn;
    default: return false;
  }
}

int py_compare(const Value& a, const Value& b) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  Nest nest("in comparison");
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::Float || b.kind == Kind::Float) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.s.compare(b.s);  // UTF-8 byte order is code-point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple == b.is_tuple && !a.is_iter && !b.is_iter) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (py_equal((*a.list)[k], (*b.list)[k])) continue;
      return py_compare((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size() ? -1 : (a.list->size() > b.list->size() ? 1 : 0);
  }
  throw Error("TypeError: '<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

static void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : pystr::decode(s)) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else if (ensure_ascii && c > 0x7e) {
          if (c >= 0x10000) {
            unsigned v = static_cast<unsigned>(c) - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
          }
        } else {
          pystr::append_utf8(out, c);
        }
    }
  }
  out += '"';
}

static void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int depth) {
  if (depth > 900) throw Error("RecursionError: maximum recursion depth exceeded while encoding a JSON object");
  std::string item_sep = !o.item_sep.empty() ? o.item_sep : (o.indent >= 0 ? "," : ", ");
  std::string key_sep = !o.key_sep.empty() ? o.key_sep : ": ";
  auto newline = [&](int d) {
    if (o.indent < 0) return;
    out += '\n';
    out += std::string(static_cast<size_t>(o.indent * d), ' ');
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      return;
    case Kind::String: dump_string(out, v.s, o.ensure_ascii); return;
    case Kind::List: {
      if (v.is_iter) break;
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        dump(out, (*v.list)[k], o, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.is_namespace) break;
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        newline(depth + 1);
        dump_string(out, items[k]->first, o.ensure_ascii);
        out += key_sep;
        dump(out, items[k]->second, o, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: break;
  }
  throw Error("TypeError: Object of type " + type_name(v) + " is not JSON serializable");
}

std::string json_dumps(const Value& v, const JsonDumpOptions& opts) {
  std::string out;
  dump(out, v, opts, 0);
  return out;
}

}  // namespace lily::jinja
