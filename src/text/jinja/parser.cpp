// Recursive-descent parser with jinja2's precedence: condexpr < or < and < not < compare
// (==, in, not in, ...) < + - < ~ < * / // % < ** < unary - + < postfix (. [] ()) and
// filters/tests (| and is bind to the unary operand, as in jinja2).
#include "text/jinja/parser.h"

#include <fmt/format.h>

namespace lily::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != Tok::Eof) fail(fmt::format("unexpected '{}'", cur().value));
    return body;
  }

 private:
  const std::vector<Token>& t_;
  size_t p_ = 0;
  int loop_depth_ = 0;
  // Nesting of blocks and expressions (the parser and the renderer recurse on it): bounded so a
  // hostile template is a syntax error, not a stack overflow.
  static constexpr int kMaxNesting = 256;
  int nesting_ = 0;
  struct Nest {
    Parser& p;
    explicit Nest(Parser& q) : p(q) {
      if (++p.nesting_ > kMaxNesting) {
        --p.nesting_;
        p.fail(fmt::format("blocks or expressions nested deeper than {}", kMaxNesting));
      }
    }
    ~Nest() { --p.nesting_; }
  };

  const Token& cur() const { return t_[p_]; }
  const Token& look(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  [[noreturn]] void fail(const std::string& msg, int line = -1) const {
    throw Error("TemplateSyntaxError: " + msg, line < 0 ? cur().line : line);
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarEnd: return "end of print statement";
      case Tok::Eof: return "end of template";
      case Tok::Text: return "template data";
      default: return "'" + t.value + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}', got {}", op, describe(cur())));
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail(fmt::format("expected a name, got {}", describe(cur())));
    return next().value;
  }
  void expect(Tok type, const char* what) {
    if (cur().type != type) fail(fmt::format("expected {}, got {}", what, describe(cur())));
    next();
  }
  ExprPtr node(ExprKind k, int line) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- statements ----
  Body subparse(const std::vector<std::string>& end_names) {
    Nest nest(*this);
    Body body;
    while (cur().type != Tok::Eof) {
      const Token& tk = cur();
      if (tk.type == Tok::Text) {
        auto s = std::make_shared<Stmt>();
        s->kind = StmtKind::Text;
        s->line = tk.line;
        s->text = tk.value;
        body.push_back(s);
        next();
      } else if (tk.type == Tok::VarBegin) {
        next();
        auto s = std::make_shared<Stmt>();
        s->kind = StmtKind::Output;
        s->line = tk.line;
        s->expr = parse_tuple(false, true, {}, false);
        expect(Tok::VarEnd, "end of print statement");
        body.push_back(s);
      } else if (tk.type == Tok::BlockBegin) {
        const Token& name = look();
        if (name.type == Tok::Name)
          for (auto& e : end_names)
            if (name.value == e) {
              next();  // leave the position at the end tag's name
              return body;
            }
        next();
        body.push_back(parse_statement());
        expect(Tok::BlockEnd, "end of statement block");
      } else {
        fail("unexpected " + describe(tk));
      }
    }
    if (!end_names.empty()) {
      std::string list;
      for (auto& e : end_names) list += (list.empty() ? "'" : " or '") + e + "'";
      fail("unexpected end of template, expected " + list);
    }
    return body;
  }

  // Reads "[:] %}" then a body up to one of end_names; leaves the position at that name.
  Body parse_statements(const std::vector<std::string>& end_names) {
    skip_op(":");
    expect(Tok::BlockEnd, "end of statement block");
    return subparse(end_names);
  }

  StmtPtr parse_statement() {
    if (cur().type != Tok::Name) fail("tag name expected");
    int line = cur().line;
    std::string tag = cur().value;
    auto s = std::make_shared<Stmt>();
    s->line = line;
    next();
    if (tag == "if") {
      s->kind = StmtKind::If;
      while (true) {
        s->conds.push_back(parse_tuple(false, false, {}, false));
        s->bodies.push_back(parse_statements({"elif", "else", "endif"}));
        std::string t = next().value;
        if (t == "elif") continue;
        if (t == "else") s->else_body = parse_statements({"endif"}), next();
        break;
      }
    } else if (tag == "for") {
      s->kind = StmtKind::For;
      s->target = parse_assign_target({"in"}, false);
      if (!skip_name("in")) fail("expected 'in'");
      s->expr = parse_tuple(false, false, {"recursive"}, false);
      if (skip_name("if")) s->cond = parse_expression(true);
      if (is_name("recursive")) fail("recursive for loops are not supported");
      ++loop_depth_;
      s->body = parse_statements({"endfor", "else"});
      --loop_depth_;
      if (next().value == "else") s->else_body = parse_statements({"endfor"}), next();
    } else if (tag == "set") {
      s->target = parse_assign_target({}, true);
      if (skip_op("=")) {
        s->kind = StmtKind::Set;
        s->expr = parse_tuple(false, true, {}, false);
      } else {
        s->kind = StmtKind::SetBlock;
        if (s->target->kind != ExprKind::Name && s->target->kind != ExprKind::GetAttr)
          fail("block set needs a single name");
        if (is_op("|")) s->expr = parse_filter(nullptr, false);
        s->body = parse_statements({"endset"});
        next();
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!s->params.empty()) expect_op(",");
        MacroParam mp;
        mp.name = expect_name();
        if (skip_op("=")) mp.default_value = parse_expression(true);
        s->params.push_back(std::move(mp));
      }
      next();
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_statements({"endmacro"});
      loop_depth_ = saved;
      next();
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail(fmt::format("'{}' outside of a loop", tag), line);
      s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
    } else if (tag == "generation") {
      s->kind = StmtKind::Generation;
      s->body = parse_statements({"endgeneration"});
      next();
    } else if (tag == "with") {
      s->kind = StmtKind::With;
      while (cur().type != Tok::BlockEnd) {
        if (!s->assigns.empty()) expect_op(",");
        ExprPtr target = parse_assign_target({}, false);
        expect_op("=");
        s->assigns.emplace_back(target, parse_expression(true));
      }
      s->body = parse_statements({"endwith"});
      next();
    } else {
      fail(fmt::format("unsupported or unknown tag '{}'", tag), line);
    }
    return s;
  }

  ExprPtr parse_assign_target(const std::vector<std::string>& extra_end, bool with_namespace) {
    if (with_namespace && cur().type == Tok::Name && look().type == Tok::Op && look().value == ".") {
      auto e = node(ExprKind::GetAttr, cur().line);
      auto base = node(ExprKind::Name, cur().line);
      base->name = next().value;
      next();
      e->name = expect_name();
      e->args.push_back(base);
      return e;
    }
    ExprPtr target = parse_tuple(true, true, extra_end, false);
    auto check = [&](const ExprPtr& x) {
      if (x->kind != ExprKind::Name) fail("can't assign to this expression", x->line);
      if (x->name == "true" || x->name == "false" || x->name == "none" || x->name == "True" ||
          x->name == "False" || x->name == "None")
        fail("can't assign to constant " + x->name, x->line);
    };
    if (target->kind == ExprKind::ListLit) {
      for (auto& x : target->args) check(x);
    } else {
      check(target);
    }
    return target;
  }

  // ---- expressions ----
  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof) return true;
    if (cur().type == Tok::Op && cur().value == ")") return true;
    if (cur().type == Tok::Name)
      for (auto& e : extra_end)
        if (cur().value == e) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      if (simplified) {
        if (cur().type != Tok::Name) fail("expected a name, got " + describe(cur()));
        auto n = node(ExprKind::Name, cur().line);
        n->name = next().value;
        args.push_back(n);
      } else {
        args.push_back(with_condexpr ? parse_expression(true) : parse_or());
      }
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return args[0];
      if (!explicit_parens) fail("expected an expression, got " + describe(cur()));
    }
    auto e = node(ExprKind::ListLit, line);
    e->is_tuple = true;
    e->args = std::move(args);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    Nest nest(*this);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3 = skip_name("else") ? parse_condexpr() : nullptr;
      auto e = node(ExprKind::CondExpr, line);
      e->args = {expr2, expr1, expr3};
      expr1 = e;
    }
    return expr1;
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto e = node(ExprKind::Binary, line);
    e->name = op;
    e->args = {std::move(l), std::move(r)};
    return e;
  }

  ExprPtr parse_or() {
    int line = cur().line;
    ExprPtr left = parse_and();
    while (skip_name("or")) left = binary("or", left, parse_and(), line);
    return left;
  }
  ExprPtr parse_and() {
    int line = cur().line;
    ExprPtr left = parse_not();
    while (skip_name("and")) left = binary("and", left, parse_not(), line);
    return left;
  }
  ExprPtr parse_not() {
    Nest nest(*this);
    if (is_name("not")) {
      int line = next().line;
      auto e = node(ExprKind::Unary, line);
      e->name = "not";
      e->args = {parse_not()};
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr expr = parse_math1();
    auto e = node(ExprKind::Compare, line);
    e->args.push_back(expr);
    while (true) {
      if (cur().type == Tok::Op && (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
                                    cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        e->ops.push_back(next().value);
      } else if (skip_name("in")) {
        e->ops.push_back("in");
      } else if (is_name("not") && look().type == Tok::Name && look().value == "in") {
        next();
        next();
        e->ops.push_back("notin");
      } else {
        break;
      }
      e->args.push_back(parse_math1());
    }
    return e->ops.empty() ? expr : e;
  }
  ExprPtr parse_math1() {
    int line = cur().line;
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().value;
      left = binary(op, left, parse_concat(), line);
    }
    return left;
  }
  ExprPtr parse_concat() {
    int line = cur().line;
    ExprPtr left = parse_math2();
    while (skip_op("~")) left = binary("~", left, parse_math2(), line);
    return left;
  }
  ExprPtr parse_math2() {
    int line = cur().line;
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().value;
      left = binary(op, left, parse_pow(), line);
    }
    return left;
  }
  ExprPtr parse_pow() {
    int line = cur().line;
    ExprPtr left = parse_unary(true);
    while (skip_op("**")) left = binary("**", left, parse_unary(true), line);
    return left;
  }
  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    int line = cur().line;
    ExprPtr n;
    if (is_op("-") || is_op("+")) {
      std::string op = next().value;
      n = node(ExprKind::Unary, line);
      n->name = op;
      n->args = {parse_unary(false)};
    } else {
      n = parse_primary();
    }
    n = parse_postfix(n);
    if (with_filter) n = parse_filter_expr(n);
    return n;
  }

  ExprPtr parse_primary() {
    const Token& tk = cur();
    int line = tk.line;
    if (tk.type == Tok::Name) {
      next();
      auto e = node(ExprKind::Literal, line);
      if (tk.value == "true" || tk.value == "True") e->literal = Value::boolean(true);
      else if (tk.value == "false" || tk.value == "False") e->literal = Value::boolean(false);
      else if (tk.value == "none" || tk.value == "None") e->literal = Value::none();
      else e->kind = ExprKind::Name, e->name = tk.value;
      return e;
    }
    if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += next().value;
      auto e = node(ExprKind::Literal, line);
      e->literal = Value::string(s);
      return e;
    }
    if (tk.type == Tok::Int || tk.type == Tok::Float) {
      next();
      auto e = node(ExprKind::Literal, line);
      e->literal = tk.type == Tok::Int ? Value::integer(tk.i) : Value::real(tk.f);
      return e;
    }
    if (skip_op("(")) {
      ExprPtr e = parse_tuple(false, true, {}, true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = node(ExprKind::ListLit, line);
      while (!is_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    if (skip_op("{")) {
      auto e = node(ExprKind::DictLit, line);
      while (!is_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (is_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      next();
      return e;
    }
    fail("unexpected " + describe(tk));
  }

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      int line = cur().line;
      if (skip_op(".")) {
        if (cur().type == Tok::Name) {
          auto e = node(ExprKind::GetAttr, line);
          e->name = next().value;
          e->args = {n};
          n = e;
        } else if (cur().type == Tok::Int) {
          auto e = node(ExprKind::GetItem, line);
          auto k = node(ExprKind::Literal, line);
          k->literal = Value::integer(next().i);
          e->args = {n, k};
          n = e;
        } else {
          fail("expected name or number after '.'");
        }
      } else if (skip_op("[")) {
        std::vector<ExprPtr> subs;
        while (!is_op("]")) {
          if (!subs.empty()) expect_op(",");
          subs.push_back(parse_subscribed());
        }
        next();
        if (subs.empty()) fail("expected subscript expression", line);
        ExprPtr key = subs[0];
        if (subs.size() > 1) {
          // x[a:b, c]: a tuple holding a slice, which nothing in Python or jinja2 can index by (and
          // the Slice node's null target once crashed the renderer). Found by jinja_fuzz.
          for (const auto& sub : subs)
            if (sub->kind == ExprKind::Slice) fail("unsupported: a slice inside a tuple subscript", line);
          key = node(ExprKind::ListLit, line);
          key->is_tuple = true;
          key->args = subs;
        }
        if (key->kind == ExprKind::Slice) {
          key->args[0] = n;
          n = key;
        } else {
          auto e = node(ExprKind::GetItem, line);
          e->args = {n, key};
          n = e;
        }
      } else if (is_op("(")) {
        n = parse_call(n);
      } else {
        return n;
      }
    }
  }

  // Returns an expression, or a Slice node with args[0] left null for the caller to fill.
  ExprPtr parse_subscribed() {
    int line = cur().line;
    std::vector<ExprPtr> parts;
    if (skip_op(":")) {
      parts.push_back(nullptr);
    } else {
      ExprPtr e = parse_expression(true);
      if (!skip_op(":")) return e;
      parts.push_back(e);
    }
    if (is_op(":")) parts.push_back(nullptr);
    else if (!is_op("]") && !is_op(",")) parts.push_back(parse_expression(true));
    else parts.push_back(nullptr);
    if (skip_op(":")) {
      if (!is_op("]") && !is_op(",")) parts.push_back(parse_expression(true));
      else parts.push_back(nullptr);
    } else {
      parts.push_back(nullptr);
    }
    auto s = node(ExprKind::Slice, line);
    s->args = {nullptr, parts[0], parts[1], parts[2]};
    return s;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args / **kwargs in calls are not supported");
      if (cur().type == Tok::Name && look().type == Tok::Op && look().value == "=") {
        std::string key = next().value;
        next();
        e.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    next();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = node(ExprKind::Call, cur().line);
    e->args.push_back(callee);
    parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filter(ExprPtr n, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      int line = cur().line;
      std::string name = expect_name();
      while (skip_op(".")) name += "." + expect_name();
      if (!has_filter(name)) fail(fmt::format("no filter named '{}'", name), line);
      auto e = node(ExprKind::Filter, line);
      e->name = name;
      e->args.push_back(n);
      if (is_op("(")) parse_call_args(*e);
      n = e;
    }
    return n;
  }

  ExprPtr parse_test(ExprPtr n) {
    int line = next().line;  // 'is'
    bool negated = skip_name("not");
    std::string name = expect_name();
    while (skip_op(".")) name += "." + expect_name();
    if (!has_test(name)) fail(fmt::format("no test named '{}'", name), line);
    auto e = node(ExprKind::Test, line);
    e->name = name;
    e->args.push_back(n);
    const Token& tk = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((tk.type == Tok::Name || tk.type == Tok::String || tk.type == Tok::Int || tk.type == Tok::Float ||
                is_op("[") || is_op("{")) &&
               !(tk.type == Tok::Name && (tk.value == "else" || tk.value == "or" || tk.value == "and"))) {
      if (is_name("is")) fail("you cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto nt = node(ExprKind::Unary, line);
    nt->name = "not";
    nt->args = {e};
    return nt;
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (is_op("|")) n = parse_filter(n, false);
      else if (is_name("is")) n = parse_test(n);
      else if (is_op("(")) n = parse_call(n);
      else return n;
    }
  }
};

}  // namespace

Body parse(const std::vector<Token>& tokens) { return Parser(tokens).parse_all(); }

}  // namespace lily::jinja
