// Python's binary operators (+ - * / // % ** and jinja's ~), `in`, and printf-style str % args,
// with Python's int/float promotion and error cases (TypeError, ZeroDivisionError).
#include <cmath>

#include <fmt/format.h>

#include "text/jinja/interp.h"
#include "text/jinja/pystr.h"

namespace lily::jinja {
namespace {

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  throw Error(fmt::format("TypeError: unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
                          type_name(b)));
}

int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t intmod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
double floatmod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value repeat(const Value& seq, int64_t n) {
  const size_t len = seq.is_string() ? seq.s.size() : seq.list->size();
  if (len == 0) n = 0;  // '' * 10**14 is '' at once, as in Python, not 10**14 empty appends
  if (n > 0) {
    const size_t limit = seq.is_string() ? limits.max_string_bytes : kMaxListItems;
    check_size(uint64_t(n) > limit ? limit + 1 : len * size_t(n), limit);
  }
  if (seq.is_string()) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    return Value::string(out, seq.safe);
  }
  List out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::from_list(std::move(out), seq.is_tuple);
}

// Python ints are unbounded; lily's are int64 and refuse to wrap silently.
Value checked(bool overflowed, int64_t v) {
  if (overflowed) throw Error("unsupported: integer overflow beyond 64 bits");
  return Value::integer(v);
}
Value int_add(int64_t a, int64_t b) {
  int64_t r;
  bool o = __builtin_add_overflow(a, b, &r);
  return checked(o, r);
}
Value int_sub(int64_t a, int64_t b) {
  int64_t r;
  bool o = __builtin_sub_overflow(a, b, &r);
  return checked(o, r);
}
Value int_mul(int64_t a, int64_t b) {
  int64_t r;
  bool o = __builtin_mul_overflow(a, b, &r);
  return checked(o, r);
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string l = py_str(a), r = py_str(b);
    check_size(l.size() + r.size());
    return Value::string(l + r);
  }
  if (op == "%" && a.is_string()) return Value::string(percent_format(a.s, b));
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  bool both_num = a.is_number() && b.is_number();
  bool any_float = a.kind == Kind::Float || b.kind == Kind::Float;
  if (op == "+") {
    if (both_num) return any_float ? Value::real(a.as_double() + b.as_double()) : int_add(a.as_int(), b.as_int());
    if (a.is_string() && b.is_string()) {
      check_size(a.s.size() + b.s.size());
      if (a.safe || b.safe)  // markupsafe: Markup + str escapes the plain str
        return Value::string((a.safe ? a.s : pystr::html_escape(a.s)) + (b.safe ? b.s : pystr::html_escape(b.s)), true);
      return Value::string(a.s + b.s);
    }
    if (a.is_list() && b.is_list() && a.is_tuple == b.is_tuple && !a.is_iter && !b.is_iter) {
      check_size(a.list->size() + b.list->size(), kMaxListItems);
      List out = *a.list;
      out.insert(out.end(), b.list->begin(), b.list->end());
      return Value::from_list(std::move(out), a.is_tuple);
    }
    if (a.is_string() && !b.is_string())
      throw Error(fmt::format("TypeError: can only concatenate str (not \"{}\") to str", type_name(b)));
    type_error("+", a, b);
  }
  if (op == "-") {
    if (both_num) return any_float ? Value::real(a.as_double() - b.as_double()) : int_sub(a.as_int(), b.as_int());
    type_error("-", a, b);
  }
  if (op == "*") {
    if (both_num) return any_float ? Value::real(a.as_double() * b.as_double()) : int_mul(a.as_int(), b.as_int());
    if ((a.is_string() || (a.is_list() && !a.is_iter)) && b.is_int_like()) return repeat(a, b.as_int());
    if ((b.is_string() || (b.is_list() && !b.is_iter)) && a.is_int_like()) return repeat(b, a.as_int());
    type_error("*", a, b);
  }
  if (op == "/") {
    if (!both_num) type_error("/", a, b);
    if (b.as_double() == 0) throw Error("ZeroDivisionError: division by zero");
    return Value::real(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!both_num) type_error("//", a, b);
    if (b.as_double() == 0) throw Error("ZeroDivisionError: integer division or modulo by zero");
    if (any_float) return Value::real(std::floor(a.as_double() / b.as_double()));
    return Value::integer(floordiv(a.as_int(), b.as_int()));
  }
  if (op == "%") {
    if (a.is_string()) return Value::string(percent_format(a.s, b));
    if (!both_num) type_error("%", a, b);
    if (b.as_double() == 0) throw Error("ZeroDivisionError: integer division or modulo by zero");
    if (any_float) return Value::real(floatmod(a.as_double(), b.as_double()));
    return Value::integer(intmod(a.as_int(), b.as_int()));
  }
  if (op == "**") {
    if (!both_num) type_error("** or pow()", a, b);
    if (!any_float && b.as_int() >= 0) {
      // By squaring: a loop of b.as_int() steps hung on 1 ** 10**18.
      int64_t r = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {
        if (e & 1) r = int_mul(r, base).i;
        if (e > 1) base = int_mul(base, base).i;
      }
      return Value::integer(r);
    }
    return Value::real(std::pow(a.as_double(), b.as_double()));
  }
  throw Error("unknown operator " + op);
}

bool contains(const Value& c, const Value& item) {
  switch (c.kind) {
    case Kind::Undefined: return false;
    case Kind::String:
      if (!item.is_string())
        throw Error(fmt::format("TypeError: 'in <string>' requires string as left operand, not {}", type_name(item)));
      return c.s.find(item.s) != std::string::npos;
    case Kind::List:
      for (auto& x : *c.list)
        if (py_equal(x, item)) return true;
      return false;
    case Kind::Dict:
      if (c.is_namespace) break;
      if ((item.is_list() && !item.is_tuple) || item.is_dict())
        throw Error(fmt::format("TypeError: unhashable type: '{}'", type_name(item)));
      return item.is_string() && c.dict->find(item.s) != nullptr;
    default: break;
  }
  throw Error(fmt::format("TypeError: argument of type '{}' is not iterable", type_name(c)));
}

std::string percent_format(const std::string& f, const Value& args) {
  std::vector<Value> pos;
  if (args.is_list() && args.is_tuple) pos = *args.list;
  else if (!args.is_dict()) pos.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t k = 0; k < f.size(); ++k) {
    if (f[k] != '%') {
      out += f[k];
      continue;
    }
    if (++k >= f.size()) throw Error("ValueError: incomplete format");
    if (f[k] == '%') {
      out += '%';
      continue;
    }
    const Value* v = nullptr;
    if (f[k] == '(') {
      size_t e = f.find(')', k);
      if (e == std::string::npos || !args.is_dict()) throw Error("TypeError: format requires a mapping");
      v = args.dict->find(f.substr(k + 1, e - k - 1));
      if (!v) throw Error("KeyError: " + f.substr(k + 1, e - k - 1));
      k = e + 1;
    }
    std::string spec;
    while (k < f.size() && std::string("-+ 0#").find(f[k]) != std::string::npos) spec += f[k++];
    size_t digits = 0;  // of the width, then of the precision: 4 each at most (a 10^9 width is 1 GB)
    while (k < f.size() && std::isdigit(static_cast<unsigned char>(f[k]))) spec += f[k++], ++digits;
    if (digits > 4) throw Error("unsupported: %-format width over 4 digits");
    if (k < f.size() && f[k] == '.') {
      spec += f[k++];
      digits = 0;
      while (k < f.size() && std::isdigit(static_cast<unsigned char>(f[k]))) spec += f[k++], ++digits;
      if (digits > 4) throw Error("unsupported: %-format precision over 4 digits");
    }
    if (k >= f.size()) throw Error("ValueError: incomplete format");
    char conv = f[k];
    if (!v) {
      if (next >= pos.size()) throw Error("TypeError: not enough arguments for format string");
      v = &pos[next++];
    }
    if (!spec.empty() && conv != 'f' && conv != 'd' && conv != 'i')
      throw Error("unsupported: %-format flags other than on %d / %f");
    switch (conv) {
      case 's': out += py_str(*v); break;
      case 'r': out += py_repr(*v); break;
      case 'd':
      case 'i':
        if (!v->is_number()) throw Error("TypeError: %d format: a real number is required, not " + type_name(*v));
        if (v->kind == Kind::Float && !(std::fabs(v->f) < 9.2e18))  // int64 range; Python's ints are unbounded
          throw Error("unsupported: %d of a float outside the 64-bit integer range");
        out += fmt::format(fmt::runtime("{:" + spec + "d}"), static_cast<long long>(v->kind == Kind::Float ? std::trunc(v->f) : v->as_int()));
        break;
      case 'f':
        if (!v->is_number()) throw Error("TypeError: must be real number, not " + type_name(*v));
        out += fmt::format(fmt::runtime("{:" + (spec.find('.') == std::string::npos ? spec + ".6" : spec) + "f}"), v->as_double());
        break;
      default: throw Error(std::string("unsupported: %-format conversion '") + conv + "'");
    }
  }
  // Python skips this check when args has __getitem__ (dict, list): it may be a mapping.
  bool mapping_like = args.is_dict() || (args.is_list() && !args.is_tuple) || args.is_undefined();
  if (next < pos.size() && !mapping_like) throw Error("TypeError: not all arguments converted during string formatting");
  return out;
}

}  // namespace lily::jinja
