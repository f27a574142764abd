// The Jinja AST: expressions and statements as the parser builds them and the interpreter walks
// them. One node struct per family with a kind tag keeps the tree plain and easy to print.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace lily::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;

enum class ExprKind {
  Literal,   // literal
  Name,      // name
  ListLit,   // args (tuple when is_tuple)
  DictLit,   // args as key,value,key,value...
  GetAttr,   // args[0].name
  GetItem,   // args[0][args[1]]
  Slice,     // args[0][args[1]:args[2]:args[3]] (null parts absent)
  Call,      // args[0](args[1..], kwargs)
  Filter,    // args[0] | name(args[1..], kwargs); args[0] null inside {% set x | f %}
  Test,      // args[0] is name(args[1..], kwargs)
  Unary,     // name in {not, -, +}, args[0]
  Binary,    // name in {and, or, +, -, *, /, //, %, **, ~}, args[0], args[1]
  Compare,   // args[0] then (ops[k], args[k+1])...: ==, !=, <, <=, >, >=, in, notin
  CondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value literal;
  bool is_tuple = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::shared_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  Text,       // text
  Output,     // {{ expr }}
  If,         // conds[k] -> bodies[k]; else_body
  For,        // for target in expr [if cond] body [else else_body]
  Set,        // set target = expr
  SetBlock,   // set target [| filters in expr] body endset
  Macro,      // macro name(params = defaults) body
  Break,
  Continue,
  Generation,  // HF's {% generation %} (AssistantTracker): renders its body
  With,        // with targets = values body
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;       // Text data, Macro name
  ExprPtr target;         // For/Set/SetBlock: Name, ListLit of Names, or GetAttr(Name)
  ExprPtr expr;           // Output/For iterable/Set value/SetBlock filter chain
  ExprPtr cond;           // For: inline filter condition
  std::vector<ExprPtr> conds;   // If
  std::vector<Body> bodies;     // If
  Body body, else_body;
  std::vector<MacroParam> params;               // Macro
  std::vector<std::pair<ExprPtr, ExprPtr>> assigns;  // With
};

}  // namespace lily::jinja
