// Statement execution and expression evaluation. Render-time failures throw jinja::Error; the
// statement being executed stamps its line on errors that lack one.
#include "text/jinja/interp.h"

#include <algorithm>

#include <fmt/format.h>

#include "text/jinja/pystr.h"

namespace lily::jinja {

Interp::Interp(const Value& context) {
  auto globals = std::make_shared<Frame>();
  add_globals(*globals);
  root_ = std::make_shared<Frame>();
  root_->parent = globals;
  if (context.is_dict())
    for (auto& [k, v] : context.dict->items) root_->vars[k] = v;
}

Interp::~Interp() {
  // `{% set ns.me = ns %}` makes a namespace own itself; Python's collector frees that, shared_ptr
  // does not. Only assignment into a namespace can close such a cycle, so emptying those breaks all.
  for (auto& d : assigned_namespaces_) d->items.clear();
}

std::string Interp::render(const Body& body) {
  std::string out;
  exec_body(body, root_, out);
  return out;
}

void Interp::step(int64_t n) {
  if ((steps_ += n) > limits.max_render_steps)
    throw Error("unsupported: the template ran more than " + std::to_string(limits.max_render_steps) +
                " loop iterations and macro calls");
}

Flow Interp::exec_body(const Body& body, const FramePtr& f, std::string& out) {
  for (auto& s : body) {
    Flow fl = exec(*s, f, out);
    if (fl != Flow::Normal) return fl;
  }
  return Flow::Normal;
}

static FramePtr child(const FramePtr& parent) {
  auto f = std::make_shared<Frame>();
  f->parent = parent;
  return f;
}

Flow Interp::exec(const Stmt& s, const FramePtr& f, std::string& out) {
  DepthGuard guard(depth_);
  try {
    switch (s.kind) {
      case StmtKind::Text: out += s.text; check_size(out.size()); break;
      case StmtKind::Output: out += py_str(eval(*s.expr, f)); check_size(out.size()); break;
      case StmtKind::If:
        for (size_t k = 0; k < s.conds.size(); ++k)
          if (truthy(eval(*s.conds[k], f))) return exec_body(s.bodies[k], f, out);
        return exec_body(s.else_body, f, out);
      case StmtKind::For: exec_for(s, f, out); break;
      case StmtKind::Set: assign(*s.target, eval(*s.expr, f), f); break;
      case StmtKind::SetBlock: {
        std::string inner;
        exec_body(s.body, child(f), inner);
        Value v = Value::string(inner);
        if (s.expr) {
          // Apply the filter chain innermost-first: the chain's leaf has a null input.
          std::vector<const Expr*> chain;
          for (const Expr* e = s.expr.get(); e; e = e->args[0].get()) chain.push_back(e);
          for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
            CallArgs args = eval_args(**it, 1, f);
            v = apply_filter((*it)->name, v, args);
          }
        }
        assign(*s.target, v, f);
        break;
      }
      case StmtKind::Macro: f->vars[s.text] = make_macro(s, f); break;
      case StmtKind::Break: return Flow::Break;
      case StmtKind::Continue: return Flow::Continue;
      case StmtKind::Generation: return exec_body(s.body, f, out);
      case StmtKind::With: {
        FramePtr w = child(f);
        std::vector<Value> vals;
        for (auto& [t, e] : s.assigns) vals.push_back(eval(*e, f));
        for (size_t k = 0; k < s.assigns.size(); ++k) assign(*s.assigns[k].first, vals[k], w);
        return exec_body(s.body, w, out);
      }
    }
  } catch (Error& err) {
    if (err.line == 0) err.line = s.line;
    throw;
  }
  return Flow::Normal;
}

void Interp::exec_for(const Stmt& s, const FramePtr& f, std::string& out) {
  std::vector<Value> all = iterate(eval(*s.expr, f));
  std::vector<Value> items;
  if (s.cond) {
    for (auto& v : all) {
      FramePtr cf = child(f);
      assign(*s.target, v, cf);
      if (truthy(eval(*s.cond, cf))) items.push_back(v);
    }
  } else {
    items = std::move(all);
  }
  if (items.empty()) {
    exec_body(s.else_body, child(f), out);
    return;
  }
  size_t n = items.size();
  step(int64_t(n));  // charged up front: a loop that cannot finish fails before it starts
  for (size_t k = 0; k < n; ++k) {
    FramePtr it = child(f);
    Dict loop;
    loop.set("index", Value::integer(static_cast<int64_t>(k + 1)));
    loop.set("index0", Value::integer(static_cast<int64_t>(k)));
    loop.set("revindex", Value::integer(static_cast<int64_t>(n - k)));
    loop.set("revindex0", Value::integer(static_cast<int64_t>(n - k - 1)));
    loop.set("first", Value::boolean(k == 0));
    loop.set("last", Value::boolean(k + 1 == n));
    loop.set("length", Value::integer(static_cast<int64_t>(n)));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", k > 0 ? items[k - 1] : Value::undefined("there is no previous item"));
    loop.set("nextitem", k + 1 < n ? items[k + 1] : Value::undefined("there is no next item"));
    loop.set("cycle", Value::callable("cycle", [k](Interp&, CallArgs& a) {
      if (a.pos.empty()) throw Error("TypeError: no items for cycling given");
      return a.pos[k % a.pos.size()];
    }));
    it->vars["loop"] = Value::from_dict(std::move(loop));
    assign(*s.target, items[k], it);
    Flow fl = exec_body(s.body, it, out);
    if (fl == Flow::Break) break;
  }
}

void Interp::assign(const Expr& target, const Value& v, const FramePtr& f) {
  if (target.kind == ExprKind::Name) {
    f->vars[target.name] = v;
    return;
  }
  if (target.kind == ExprKind::GetAttr) {
    const Value* ns = f->lookup(target.args[0]->name);
    if (!ns || !ns->is_dict() || !ns->is_namespace)
      throw Error("TemplateRuntimeError: cannot assign attribute on non-namespace object", target.line);
    if (std::find(assigned_namespaces_.begin(), assigned_namespaces_.end(), ns->dict) == assigned_namespaces_.end())
      assigned_namespaces_.push_back(ns->dict);
    ns->dict->set(target.name, v);
    return;
  }
  // Tuple unpacking.
  std::vector<Value> items = iterate(v);
  if (items.size() != target.args.size())
    throw Error(fmt::format("ValueError: {} values to unpack (expected {})",
                            items.size() < target.args.size() ? "not enough" : "too many", target.args.size()),
                target.line);
  for (size_t k = 0; k < items.size(); ++k) assign(*target.args[k], items[k], f);
}

Value Interp::make_macro(const Stmt& s, const FramePtr& defining) {
  const Stmt* stmt = &s;
  std::weak_ptr<Frame> weak = defining;  // the frame owns the macro; avoid a cycle
  return Value::callable(s.text, [this, stmt, weak](Interp&, CallArgs& args) {
    FramePtr def = weak.lock();
    FramePtr mf = child(def);
    const auto& params = stmt->params;
    if (args.pos.size() > params.size())
      throw Error(fmt::format("TypeError: macro '{}' takes not more than {} argument(s)", stmt->text, params.size()));
    std::vector<bool> bound(params.size(), false);
    for (size_t k = 0; k < args.pos.size(); ++k) {
      mf->vars[params[k].name] = args.pos[k];
      bound[k] = true;
    }
    for (auto& [key, val] : args.kw) {
      size_t k = 0;
      while (k < params.size() && params[k].name != key) ++k;
      if (k == params.size()) throw Error(fmt::format("TypeError: macro '{}' takes no keyword argument '{}'", stmt->text, key));
      if (bound[k]) throw Error(fmt::format("TypeError: macro '{}' got multiple values for argument '{}'", stmt->text, key));
      mf->vars[key] = val;
      bound[k] = true;
    }
    for (size_t k = 0; k < params.size(); ++k) {
      if (bound[k]) continue;
      mf->vars[params[k].name] = params[k].default_value
                                     ? eval(*params[k].default_value, mf)
                                     : Value::undefined(fmt::format("parameter '{}' was not provided", params[k].name));
    }
    if (call_depth_ >= 256) throw Error("RecursionError: macro calls nested deeper than 256");
    step();
    ++call_depth_;
    std::string out;
    try {
      exec_body(stmt->body, mf, out);
    } catch (...) {
      --call_depth_;
      throw;
    }
    --call_depth_;
    return Value::string(out);
  });
}

CallArgs Interp::eval_args(const Expr& e, size_t first, const FramePtr& f) {
  CallArgs a;
  a.line = e.line;
  for (size_t k = first; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k], f));
  for (auto& [key, x] : e.kwargs) a.kw.emplace_back(key, eval(*x, f));
  return a;
}

Value Interp::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (fn.kind != Kind::Callable) throw Error("TypeError: '" + type_name(fn) + "' object is not callable");
  return fn.fn->fn(*this, args);
}

Value Interp::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  return call_filter(*this, name, input, args);
}
bool Interp::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  return call_test(*this, name, input, args);
}

Value Interp::get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail_undefined(obj);
  Value m = bound_method(obj, name);
  if (!m.is_undefined()) return m;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  std::string what = obj.is_dict() && !obj.is_namespace ? "dict object" : type_name(obj) + " object";
  if (obj.is_none()) what = "None";
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", what, name));
}

Value Interp::get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_dict() && key.is_string()) {
    if (const Value* v = obj.dict->find(key.s)) return *v;
  } else if (((obj.is_list() && !obj.is_iter) || obj.is_string()) && key.is_int_like()) {
    int64_t n = static_cast<int64_t>(obj.is_list() ? obj.list->size() : pystr::length(obj.s));
    int64_t k = key.as_int();
    if (k < 0) k += n;
    if (k >= 0 && k < n) {
      if (obj.is_list()) return (*obj.list)[static_cast<size_t>(k)];
      std::u32string u = pystr::decode(obj.s);
      return Value::string(pystr::encode(u.substr(static_cast<size_t>(k), 1)));
    }
  }
  if (key.is_string()) {  // jinja2 falls back to getattr for string keys
    Value m = bound_method(obj, key.s);
    if (!m.is_undefined()) return m;
  }
  std::string what = obj.is_dict() && !obj.is_namespace ? "dict object" : type_name(obj) + " object";
  if (obj.is_none()) what = "None";
  return Value::undefined(fmt::format("'{}' has no attribute '{}'", what, py_str(key)));
}

Value Interp::eval_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_int_like()) throw Error(std::string("TypeError: slice ") + what + " must be an integer or None");
    return v.as_int();
  };
  std::optional<int64_t> a = as_index(start, "indices"), b = as_index(stop, "indices"), st = as_index(step, "step");
  int64_t s = st.value_or(1);
  if (s == 0) throw Error("ValueError: slice step cannot be zero");
  std::u32string u;
  int64_t n;
  if (obj.is_list() && obj.is_iter) {
    return Value::undefined("'generator' object is not subscriptable");
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.list->size());
  } else if (obj.is_string()) {
    u = pystr::decode(obj.s);
    n = static_cast<int64_t>(u.size());
  } else {
    return Value::undefined("'" + type_name(obj) + "' object is not subscriptable");
  }
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) v += n;
    if (s > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  int64_t lo = clamp(a, s > 0 ? 0 : n - 1), hi = clamp(b, s > 0 ? n : -1);
  std::vector<int64_t> idx;
  for (int64_t k = lo; s > 0 ? k < hi : k > hi; k += s) idx.push_back(k);
  if (obj.is_list()) {
    List out;
    for (int64_t k : idx) out.push_back((*obj.list)[static_cast<size_t>(k)]);
    return Value::from_list(std::move(out), obj.is_tuple);
  }
  std::u32string out;
  for (int64_t k : idx) out.push_back(u[static_cast<size_t>(k)]);
  return Value::string(pystr::encode(out), obj.safe);
}

std::vector<Value> Interp::iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return {};
    case Kind::List: return *v.list;
    case Kind::Dict: {
      if (v.is_namespace) break;
      std::vector<Value> keys;
      for (auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      std::string one;
      for (char32_t c : pystr::decode(v.s)) {
        one.clear();
        pystr::append_utf8(one, c);
        chars.push_back(Value::string(one));
      }
      return chars;
    }
    default: break;
  }
  throw Error("TypeError: '" + type_name(v) + "' object is not iterable");
}

// Python's default recursion limit is 1000 frames, and jinja2 spends several per level, so no
// template that jinja2 renders comes near this; it keeps the C++ stack (8 MiB threads, ASan's larger
// frames included) from overflowing.
constexpr int kMaxDepth = 1000;

Interp::DepthGuard::DepthGuard(int& x) : d(x) {
  if (++d > kMaxDepth) {
    --d;
    throw Error("RecursionError: maximum recursion depth exceeded");
  }
}

Value Interp::eval(const Expr& e, const FramePtr& f) {
  DepthGuard guard(depth_);
  switch (e.kind) {
    case ExprKind::Literal: return e.literal;
    case ExprKind::Name: {
      const Value* v = f->lookup(e.name);
      return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::ListLit: {
      List items;
      for (auto& x : e.args) items.push_back(eval(*x, f));
      return Value::from_list(std::move(items), e.is_tuple);
    }
    case ExprKind::DictLit: {
      Dict d;
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k], f);
        if (!key.is_string()) throw Error("unsupported: dict literal keys must be strings", e.line);
        d.set(key.s, eval(*e.args[k + 1], f));
      }
      return Value::from_dict(std::move(d));
    }
    case ExprKind::GetAttr: return get_attr(eval(*e.args[0], f), e.name);
    case ExprKind::GetItem: return get_item(eval(*e.args[0], f), eval(*e.args[1], f));
    case ExprKind::Slice: {
      auto part = [&](size_t k) { return e.args[k] ? eval(*e.args[k], f) : Value::none(); };
      return eval_slice(eval(*e.args[0], f), part(1), part(2), part(3));
    }
    case ExprKind::Call: {
      Value fn = eval(*e.args[0], f);
      CallArgs args = eval_args(e, 1, f);
      return call(fn, args);
    }
    case ExprKind::Filter: {
      Value input = eval(*e.args[0], f);
      CallArgs args = eval_args(e, 1, f);
      return apply_filter(e.name, input, args);
    }
    case ExprKind::Test: {
      Value input = eval(*e.args[0], f);
      CallArgs args = eval_args(e, 1, f);
      return Value::boolean(apply_test(e.name, input, args));
    }
    case ExprKind::Unary: {
      Value v = eval(*e.args[0], f);
      if (e.name == "not") return Value::boolean(!truthy(v));
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number()) throw Error("TypeError: bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
      if (e.name == "+") return v.kind == Kind::Float ? v : Value::integer(v.as_int());
      return v.kind == Kind::Float ? Value::real(-v.f) : Value::integer(-v.as_int());
    }
    case ExprKind::Binary: {
      Value a = eval(*e.args[0], f);
      if (e.name == "and") return truthy(a) ? eval(*e.args[1], f) : a;
      if (e.name == "or") return truthy(a) ? a : eval(*e.args[1], f);
      return binary_op(e.name, a, eval(*e.args[1], f));
    }
    case ExprKind::Compare: {
      Value left = eval(*e.args[0], f);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.args[k + 1], f);
        const std::string& op = e.ops[k];
        bool ok;
        if (op == "==") ok = py_equal(left, right);
        else if (op == "!=") ok = !py_equal(left, right);
        else if (op == "in") ok = contains(right, left);
        else if (op == "notin") ok = !contains(right, left);
        else {
          int c = py_compare(left, right);
          ok = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
        }
        if (!ok) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::CondExpr:
      if (truthy(eval(*e.args[0], f))) return eval(*e.args[1], f);
      return e.args[2] ? eval(*e.args[2], f) : Value::undefined("the inline if-expression evaluated to false and no else section was defined");
  }
  return Value::undefined();
}

}  // namespace lily::jinja
