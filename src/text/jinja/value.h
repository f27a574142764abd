// The value type of the Jinja interpreter: Python's object model as far as chat templates need it
// (None, bool, int, float, str, list, tuple, dict with insertion order, namespace, callables, and
// jinja2's default Undefined). Lists and dicts are shared by reference, like Python objects.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily::jinja {

// A render-time (or load-time) failure. Internal to the interpreter: the public API
// (jinja::Template, lily::ChatTemplate) turns it into a Status.
struct Error : std::runtime_error {
  explicit Error(const std::string& msg, int line = 0) : std::runtime_error(msg), line(line) {}
  int line;
  bool raised = false;  // raise_exception(...) from the template itself
};

// Limits that keep a hostile template from exhausting memory or time (jinja2 itself bounds only
// range() at 100000): any string, the output, a list, and the work of one render. Process-wide and
// read at render time; the fuzz targets lower `limits` at start (tests/fuzz/fuzz_util.h) so that
// hitting one stays within their 1 s timeout.
struct Limits {
  size_t max_string_bytes = size_t(1) << 26;  // 64 MiB: any string, the output
  int64_t max_render_steps = 1000000;         // loop iterations + macro calls
};
inline Limits limits;
inline constexpr size_t kMaxListItems = size_t(1) << 20;
// Throws MemoryError when a result of `n` bytes (or items) would pass `limit`.
inline void check_size(size_t n, size_t limit = limits.max_string_bytes) {
  if (n > limit) throw Error("MemoryError: result larger than lily's template limit (" + std::to_string(limit) + ")");
}

struct Value;
struct Dict;
struct CallArgs;
class Interp;
using List = std::vector<Value>;
using NativeFn = std::function<Value(Interp&, CallArgs&)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Callable };

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  bool safe = false;      // String: a Markup (from |safe); '+' with a plain str escapes the str
  bool is_tuple = false;  // List: a tuple (prints as (a, b))
  bool is_iter = false;   // List: a generator/iterator (select, map, items, ...): always truthy, no len()
  bool is_namespace = false;  // Dict: a namespace() object (attributes assignable)
  int64_t i = 0;
  double f = 0;
  std::string s;  // String: UTF-8 text; Undefined: the hint used in error messages
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Callable> fn;

  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  // A list or dict this value holds alone is freed without recursion (release_nested): a template can
  // nest them as deep as its work budget allows, far deeper than the stack.
  ~Value() {
    if ((list && list.use_count() == 1) || (dict && dict.use_count() == 1)) release_nested();
  }

  static Value undefined(std::string hint = "") {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() { return make(Kind::None); }
  static Value boolean(bool x) {
    Value v = make(Kind::Bool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = make(Kind::Int);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = make(Kind::Float);
    v.f = x;
    return v;
  }
  static Value string(std::string x, bool safe = false) {
    Value v = make(Kind::String);
    v.s = std::move(x);
    v.safe = safe;
    return v;
  }
  static Value from_list(List items, bool tuple = false) {
    Value v = make(Kind::List);
    v.list = std::make_shared<List>(std::move(items));
    v.is_tuple = tuple;
    return v;
  }
  static Value from_dict(Dict d);
  static Value callable(std::string name, NativeFn fn) {
    Value v = make(Kind::Callable);
    v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_int_like() const { return kind == Kind::Int || kind == Kind::Bool; }  // Python int (bool ⊂ int)
  int64_t as_int() const { return kind == Kind::Bool ? (b ? 1 : 0) : i; }
  double as_double() const { return kind == Kind::Float ? f : static_cast<double>(as_int()); }

 private:
  void release_nested() noexcept;
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// A Python dict: insertion-ordered, string keys (JSON's and every chat template's).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const {
    for (auto& kv : items)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& kv : items)
      if (kv.first == key) {
        kv.second = std::move(v);
        return;
      }
    items.emplace_back(key, std::move(v));
  }
};

inline Value Value::from_dict(Dict d) {
  Value v = make(Kind::Dict);
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}

// Call arguments: positional then keyword, as written at the call site.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
};

// Python semantics.
bool truthy(const Value& v);
std::string py_str(const Value& v);   // str(v); Undefined -> ""
std::string py_repr(const Value& v);  // repr(v)
std::string type_name(const Value& v);  // Python's type name, for error messages
bool py_equal(const Value& a, const Value& b);
int py_compare(const Value& a, const Value& b);  // <0, 0, >0; throws TypeError-like Error
std::string float_repr(double x);                 // Python's repr(float)

// json.dumps(v, ensure_ascii, indent, separators, sort_keys) exactly as Python writes it.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;  // -1: None
  std::string item_sep, key_sep;  // empty: Python's defaults for the indent setting
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const JsonDumpOptions& opts);

// Throws the UndefinedError jinja2 raises when an Undefined is used for more than printing,
// testing or iterating.
[[noreturn]] void fail_undefined(const Value& v);

}  // namespace lily::jinja
