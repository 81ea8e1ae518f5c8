// Chat-template syntax tree: expressions and statements produced by the parser and walked by the
// evaluator. Every node keeps the line:column it started at for error messages.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace nf4flash::chat {

enum class ExprKind {
  Literal,    // lit
  Name,       // name
  List,       // items (also tuples)
  Dict,       // items as key,value pairs (even/odd)
  Unary,      // op in {"not", "-", "+"}; items[0]
  Binary,     // op; items[0], items[1] ("and"/"or" short-circuit)
  Compare,    // items[0] then (ops[k], items[k+1]) chained
  Cond,       // items = {then, cond, else?}
  GetAttr,    // items[0].name
  GetItem,    // items[0][items[1]]
  Slice,      // items[0][a:b:c]; has_slice flags which parts are present (items[1..3])
  Call,       // items[0](items[1..], kwargs)
  Filter,     // items[0] | name(items[1..], kwargs)
  Test,       // items[0] is [not] name(items[1..])
};

// Name carried by the Literal placeholder that stands for a {% filter %} block's rendered body.
inline constexpr const char* kFilterBlockInput = "<filter block body>";

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0, col = 0;
  Value lit;
  std::string name;  // Name / GetAttr / Filter / Test name; operator for Unary/Binary
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;  // Compare operators
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;          // Test: "is not"
  bool has_slice[3] = {false, false, false};
};

enum class StmtKind {
  Text,      // text
  Emit,      // {{ expr }}
  If,        // conds[k] -> bodies[k]; else_body
  For,       // targets in expr [if cond]; body; else_body
  Set,       // targets (or target + attr) = expr
  SetBlock,  // target = rendered body
  Macro,     // name(params = defaults) body
  CallBlock, // {% call(params) expr %} body {% endcall %}
  FilterBlock,  // {% filter name(args) %} body
  With,      // {% with a = x, b = y %} body
  Break,
  Continue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line = 0, col = 0;
  std::string text;                  // Text; Macro name; Set attribute (ns.attr)
  ExprPtr expr;                      // Emit/For iterable/Set value/CallBlock call/FilterBlock filter
  ExprPtr cond;                      // For filter
  std::vector<std::string> targets;  // For/Set/SetBlock/With names
  std::vector<ExprPtr> conds;        // If; With values; Macro defaults (nullptr when absent)
  std::vector<Body> bodies;          // If branches
  Body body, else_body;
  std::vector<std::string> params;   // Macro / CallBlock parameters
};

}  // namespace nf4flash::chat
