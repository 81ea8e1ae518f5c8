// Chat-template parser, expressions (see parser.h): jinja2's operator precedence from tuples and
// conditional expressions down to unary operators, literals, postfix attribute/subscript/slice/call
// and the filter (`|`) and test (`is`) chains.
#include "chat/parser_internal.h"

namespace nf4flash::chat::detail {

ExprPtr Parser::parse_tuple() {
  const Token& at = cur();
  ExprPtr first = parse_expression();
  if (!is_op(",")) return first;
  auto t = expr_node(ExprKind::List, at);
  t->items.push_back(std::move(first));
  while (is_op(",")) {
    next();
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd) break;
    t->items.push_back(parse_expression());
  }
  return t;
}

ExprPtr Parser::parse_expression() {
  Nest guard(*this, cur());
  ExprPtr e = parse_or();
  while (is_name("if")) {
    const Token& at = next();
    auto c = expr_node(ExprKind::Cond, at);
    c->line = e->line;
    c->col = e->col;
    ExprPtr cond = parse_or();
    c->items.push_back(std::move(e));
    c->items.push_back(std::move(cond));
    if (is_name("else")) {
      next();
      c->items.push_back(parse_expression());
    }
    e = std::move(c);
  }
  return e;
}

ExprPtr Parser::binary(const Token& at, const std::string& op, ExprPtr l, ExprPtr r) {
  auto b = expr_node(ExprKind::Binary, at);
  b->name = op;
  b->items.push_back(std::move(l));
  b->items.push_back(std::move(r));
  return b;
}

ExprPtr Parser::parse_or() {
  ExprPtr l = parse_and();
  while (is_name("or")) {
    const Token& at = next();
    l = binary(at, "or", std::move(l), parse_and());
  }
  return l;
}
ExprPtr Parser::parse_and() {
  ExprPtr l = parse_not();
  while (is_name("and")) {
    const Token& at = next();
    l = binary(at, "and", std::move(l), parse_not());
  }
  return l;
}
ExprPtr Parser::parse_not() {
  Nest guard(*this, cur());
  if (is_name("not")) {
    const Token& at = next();
    auto u = expr_node(ExprKind::Unary, at);
    u->name = "not";
    u->items.push_back(parse_not());
    return u;
  }
  return parse_compare();
}
ExprPtr Parser::parse_compare() {
  const Token& at = cur();
  ExprPtr first = parse_math1();
  ExprPtr cmp;
  while (true) {
    std::string op;
    if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      op = next().text;
    } else if (is_name("in")) {
      next();
      op = "in";
    } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
      next();
      next();
      op = "not in";
    } else {
      break;
    }
    if (!cmp) {
      cmp = expr_node(ExprKind::Compare, at);
      cmp->items.push_back(std::move(first));
    }
    cmp->ops.push_back(op);
    cmp->items.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(first);
}
ExprPtr Parser::parse_math1() {
  ExprPtr l = parse_concat();
  while (is_op("+") || is_op("-")) {
    const Token& at = next();
    l = binary(at, at.text, std::move(l), parse_concat());
  }
  return l;
}
ExprPtr Parser::parse_concat() {
  ExprPtr l = parse_math2();
  while (is_op("~")) {
    const Token& at = next();
    l = binary(at, "~", std::move(l), parse_math2());
  }
  return l;
}
ExprPtr Parser::parse_math2() {
  ExprPtr l = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const Token& at = next();
    l = binary(at, at.text, std::move(l), parse_pow());
  }
  return l;
}
ExprPtr Parser::parse_pow() {
  ExprPtr l = parse_unary(true);
  while (is_op("**")) {
    const Token& at = next();
    l = binary(at, "**", std::move(l), parse_unary(true));
  }
  return l;
}
ExprPtr Parser::parse_unary(bool with_filter) {
  Nest guard(*this, cur());
  ExprPtr node;
  if (is_op("-") || is_op("+")) {
    const Token& at = next();
    node = expr_node(ExprKind::Unary, at);
    node->name = at.text;
    node->items.push_back(parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  if (with_filter) node = parse_filter_expr(std::move(node));
  return node;
}

ExprPtr Parser::parse_primary() {
  const Token& tk = cur();
  switch (tk.type) {
    case Tok::Name: {
      next();
      auto e = expr_node(ExprKind::Literal, tk);
      const std::string& n = tk.text;
      if (n == "true" || n == "True") e->lit = Value::boolean(true);
      else if (n == "false" || n == "False") e->lit = Value::boolean(false);
      else if (n == "none" || n == "None") e->lit = Value::none();
      else {
        e->kind = ExprKind::Name;
        e->name = n;
      }
      return e;
    }
    case Tok::String: {
      std::string s;
      while (cur().type == Tok::String) s += next().text;
      auto e = expr_node(ExprKind::Literal, tk);
      e->lit = Value::string(std::move(s));
      return e;
    }
    case Tok::Int: case Tok::Float: {
      next();
      auto e = expr_node(ExprKind::Literal, tk);
      e->lit = tk.type == Tok::Int ? Value::integer(tk.ival) : Value::number(tk.fval);
      return e;
    }
    case Tok::Op:
      if (tk.text == "(") {
        next();
        if (is_op(")")) {
          next();
          return expr_node(ExprKind::List, tk);
        }
        ExprPtr e = parse_expression();
        if (is_op(",")) {
          auto t = expr_node(ExprKind::List, tk);
          t->items.push_back(std::move(e));
          while (is_op(",")) {
            next();
            if (is_op(")")) break;
            t->items.push_back(parse_expression());
          }
          e = std::move(t);
        }
        expect_op(")");
        return e;
      }
      if (tk.text == "[") {
        next();
        auto e = expr_node(ExprKind::List, tk);
        while (!is_op("]")) {
          if (!e->items.empty()) expect_op(",");
          if (is_op("]")) break;
          e->items.push_back(parse_expression());
        }
        next();
        return e;
      }
      if (tk.text == "{") {
        next();
        auto e = expr_node(ExprKind::Dict, tk);
        while (!is_op("}")) {
          if (!e->items.empty()) expect_op(",");
          if (is_op("}")) break;
          e->items.push_back(parse_expression());
          expect_op(":");
          e->items.push_back(parse_expression());
        }
        next();
        return e;
      }
      break;
    default: break;
  }
  error(tk, "unexpected " + describe(tk) + " in expression");
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    const Token& at = cur();
    if (is_op(".")) {
      next();
      if (cur().type == Tok::Name) {
        auto e = expr_node(ExprKind::GetAttr, at);
        e->name = next().text;
        e->items.push_back(std::move(node));
        node = std::move(e);
      } else if (cur().type == Tok::Int) {
        auto e = expr_node(ExprKind::GetItem, at);
        auto idx = expr_node(ExprKind::Literal, cur());
        idx->lit = Value::integer(next().ival);
        e->items.push_back(std::move(node));
        e->items.push_back(std::move(idx));
        node = std::move(e);
      } else {
        error(cur(), "expected an attribute name after '.', got " + describe(cur()));
      }
    } else if (is_op("[")) {
      next();
      node = parse_subscript(std::move(node), at);
    } else if (is_op("(")) {
      node = parse_call(std::move(node), at);
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr obj, const Token& at) {
  ExprPtr parts[3];
  bool present[3] = {false, false, false};
  bool is_slice = false;
  for (int k = 0; k < 3; ++k) {
    if (!is_op(":") && !is_op("]")) {
      parts[k] = parse_expression();
      present[k] = true;
    }
    if (k < 2 && is_op(":")) {
      next();
      is_slice = true;
      continue;
    }
    break;
  }
  if (is_op(",")) error(cur(), "unsupported construct: tuple subscripts");
  expect_op("]");
  if (!is_slice) {
    if (!present[0]) error(at, "empty subscript '[]'");
    auto e = expr_node(ExprKind::GetItem, at);
    e->items.push_back(std::move(obj));
    e->items.push_back(std::move(parts[0]));
    return e;
  }
  auto e = expr_node(ExprKind::Slice, at);
  e->items.push_back(std::move(obj));
  for (int k = 0; k < 3; ++k) {
    e->has_slice[k] = present[k];
    e->items.push_back(std::move(parts[k]));
  }
  return e;
}

void Parser::parse_args(Expr& call) {
  expect_op("(");
  bool any = false;
  while (!is_op(")")) {
    if (any) expect_op(",");
    if (is_op(")")) break;
    any = true;
    if (is_op("*") || is_op("**")) error(cur(), "unsupported construct: '*args'/'**kwargs' in calls");
    if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
      std::string key = next().text;
      next();
      call.kwargs.emplace_back(key, parse_expression());
    } else {
      if (!call.kwargs.empty()) error(cur(), "positional argument after keyword argument");
      call.items.push_back(parse_expression());
    }
  }
  next();
}

ExprPtr Parser::parse_call(ExprPtr callee, const Token& at) {
  auto e = expr_node(ExprKind::Call, at);
  e->line = callee->line;  // errors point at what is called, not at '('
  e->col = callee->col;
  e->items.push_back(std::move(callee));
  parse_args(*e);
  return e;
}

std::string Parser::dotted_name() {
  std::string n = expect_name("a filter or test name");
  while (is_op(".") && peek().type == Tok::Name) {
    next();
    n += "." + next().text;
  }
  return n;
}

// `| name(args)` chain; with node == nullptr builds a chain applied to a placeholder (filter blocks).
ExprPtr Parser::parse_filter_chain(ExprPtr node, const Token& at) {
  bool first = node == nullptr;
  do {
    if (!first) next();  // '|'
    first = false;
    const Token& ft = cur();
    auto f = expr_node(ExprKind::Filter, ft);
    f->name = dotted_name();
    if (node) {
      f->items.push_back(std::move(node));
    } else {
      auto placeholder = expr_node(ExprKind::Literal, at);
      placeholder->name = kFilterBlockInput;
      f->items.push_back(std::move(placeholder));
    }
    if (is_op("(")) parse_args(*f);
    node = std::move(f);
  } while (is_op("|"));
  return node;
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    const Token& at = cur();
    if (is_op("|")) {
      node = parse_filter_chain(std::move(node), at);
    } else if (is_name("is")) {
      next();
      auto t = expr_node(ExprKind::Test, at);
      if (is_name("not")) {
        next();
        t->negated = true;
      }
      t->name = dotted_name();
      t->items.push_back(std::move(node));
      if (is_op("(")) {
        parse_args(*t);
      } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                  cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                 !is_name("else") && !is_name("or") && !is_name("and")) {
        t->items.push_back(parse_postfix(parse_primary()));
      }
      node = std::move(t);
    } else if (is_op("(")) {
      node = parse_call(std::move(node), at);
    } else {
      return node;
    }
  }
}

}  // namespace nf4flash::chat::detail
