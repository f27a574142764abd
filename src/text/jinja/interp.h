// The Jinja interpreter: walks the AST over jinja::Value with jinja2's scoping (a for-loop
// iteration, macro call or block set opens a frame; if does not; macros see the frame they were
// defined in, so top-level variables at call time) and jinja2's default Undefined.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace lily::jinja {

struct Frame {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;
  const Value* lookup(const std::string& name) const {
    for (const Frame* f = this; f; f = f->parent.get()) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using FramePtr = std::shared_ptr<Frame>;

enum class Flow { Normal, Break, Continue };

class Interp {
 public:
  // context: the render variables (a Dict value); globals (range, namespace, raise_exception,
  // strftime_now, dict) sit beneath them.
  explicit Interp(const Value& context);
  ~Interp();  // empties the namespaces assigned to, which may hold themselves (a reference cycle)
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  std::string render(const Body& body);

  Value eval(const Expr& e, const FramePtr& f);
  Value call(const Value& fn, CallArgs& args);
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);
  // The items a for loop (or list()) yields: list elements, dict keys, string characters;
  // Undefined yields nothing. Throws TypeError for non-iterables.
  std::vector<Value> iterate(const Value& v);

 private:
  FramePtr root_;
  int64_t steps_ = 0;   // loop iterations + macro calls so far, bounded by limits.max_render_steps
  void step(int64_t n = 1);
  std::vector<std::shared_ptr<Dict>> assigned_namespaces_;  // see ~Interp
  int call_depth_ = 0;  // macro nesting; bounded so a runaway recursion is an error, not a crash
  int depth_ = 0;       // eval/exec recursion in all, bounded (kMaxDepth) for the same reason
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& x);
    ~DepthGuard() { --d; }
  };
  Flow exec_body(const Body& body, const FramePtr& f, std::string& out);
  Flow exec(const Stmt& s, const FramePtr& f, std::string& out);
  void exec_for(const Stmt& s, const FramePtr& f, std::string& out);
  void assign(const Expr& target, const Value& v, const FramePtr& f);
  Value make_macro(const Stmt& s, const FramePtr& f);
  Value eval_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  CallArgs eval_args(const Expr& e, size_t first, const FramePtr& f);
};

// Builtins (builtins.cpp, methods.cpp).
Value call_filter(Interp& in, const std::string& name, const Value& input, CallArgs& args);
bool call_test(Interp& in, const std::string& name, const Value& input, CallArgs& args);
Value bound_method(const Value& obj, const std::string& name);  // Undefined kind when none
void add_globals(Frame& f);
Value binary_op(const std::string& op, const Value& a, const Value& b);  // + - * / // % ** ~
bool contains(const Value& container, const Value& item);                 // Python `in`
std::string percent_format(const std::string& fmt, const Value& args);    // Python str % args

}  // namespace lily::jinja
