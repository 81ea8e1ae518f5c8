// Chat-template parser (see parser.h): recursive descent over lexer tokens.
#include "chat/parser.h"

#include <set>

#include "chat/lexer.h"
#include "core/error.h"

namespace nf4flash::chat {
namespace {

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::Data: return "template text";
    case Tok::VarBegin: return "'{{'";
    case Tok::VarEnd: return "'}}'";
    case Tok::BlockBegin: return "'{%'";
    case Tok::BlockEnd: return "'%}'";
    case Tok::Name: return "'" + t.text + "'";
    case Tok::String: return "string literal";
    case Tok::Int: case Tok::Float: return "number " + t.text;
    case Tok::Op: return "'" + t.text + "'";
    case Tok::Eof: return "end of template";
  }
  return "?";
}

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t p_ = 0;
  int loop_depth_ = 0;
  std::vector<const Token*> open_stack_;  // keywords of the block statements being parsed

  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }

  [[noreturn]] void error(const Token& at, const std::string& msg) const {
    fail("chat template: line ", at.line, ":", at.col, ": ", msg);
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cur(), std::string("expected '") + op + "', got " + describe(cur()));
    next();
  }
  std::string expect_name(const char* what) {
    if (cur().type != Tok::Name) error(cur(), std::string("expected ") + what + ", got " + describe(cur()));
    return next().text;
  }
  void expect_block_end(const char* stmt) {
    if (cur().type != Tok::BlockEnd)
      error(cur(), std::string("expected '%}' to end '") + stmt + "', got " + describe(cur()));
    next();
  }

  template <typename N>
  std::unique_ptr<N> node_at(const Token& at) {
    auto n = std::make_unique<N>();
    n->line = at.line;
    n->col = at.col;
    return n;
  }
  ExprPtr expr_node(ExprKind k, const Token& at) {
    auto e = node_at<Expr>(at);
    e->kind = k;
    return e;
  }
  StmtPtr stmt_node(StmtKind k, const Token& at) {
    auto s = node_at<Stmt>(at);
    s->kind = k;
    return s;
  }

  // ---- statements ----------------------------------------------------------------------------
  // Parses until a block tag named in `ends` (left unconsumed after '{%'; its name goes to `end`).
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::Eof) {
        if (!ends.empty()) {
          std::string closer;
          for (const auto& e : ends)
            if (e.rfind("end", 0) == 0) closer = e;
          const Token& open = open_stack_.empty() ? tk : *open_stack_.back();
          error(open, "'" + open.text + "' is never closed (missing '{% " + closer + " %}')");
        }
        return body;
      }
      if (tk.type == Tok::Data) {
        auto s = stmt_node(StmtKind::Text, tk);
        s->text = tk.text;
        body.push_back(std::move(s));
        next();
      } else if (tk.type == Tok::VarBegin) {
        next();
        auto s = stmt_node(StmtKind::Emit, tk);
        s->expr = parse_tuple();
        if (cur().type != Tok::VarEnd) error(cur(), "expected '}}', got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (tk.type == Tok::BlockBegin) {
        const Token& kw = peek();
        if (kw.type == Tok::Name && ends.count(kw.text)) {
          next();
          end = next().text;
          return body;
        }
        next();
        parse_statement(body);
      } else {
        error(tk, "unexpected " + describe(tk));
      }
    }
  }

  void parse_statement(Body& out) {
    const Token& kw = cur();
    if (kw.type != Tok::Name) error(kw, "expected a statement name after '{%', got " + describe(kw));
    const std::string k = kw.text;
    std::string end;
    open_stack_.push_back(&kw);
    parse_statement_body(kw, k, end, out);
    open_stack_.pop_back();
  }

  void parse_statement_body(const Token& kw, const std::string& k, std::string& end, Body& out) {
    if (k == "if") {
      next();
      auto s = stmt_node(StmtKind::If, kw);
      s->conds.push_back(parse_expression());
      expect_block_end("if");
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
        if (end == "elif") {
          s->conds.push_back(parse_expression());
          expect_block_end("elif");
        } else if (end == "else") {
          expect_block_end("else");
          s->else_body = parse_body({"endif"}, end);
          expect_block_end("endif");
          break;
        } else {
          expect_block_end("endif");
          break;
        }
      }
      out.push_back(std::move(s));
    } else if (k == "for") {
      next();
      auto s = stmt_node(StmtKind::For, kw);
      s->targets = parse_targets();
      if (!is_name("in")) error(cur(), "expected 'in' in 'for', got " + describe(cur()));
      next();
      s->expr = parse_or();
      if (is_name("if")) {
        next();
        s->cond = parse_expression();
      }
      if (is_name("recursive")) error(cur(), "unsupported construct: recursive for loops");
      expect_block_end("for");
      ++loop_depth_;
      s->body = parse_body({"else", "endfor"}, end);
      --loop_depth_;
      if (end == "else") {
        expect_block_end("else");
        s->else_body = parse_body({"endfor"}, end);
      }
      expect_block_end("endfor");
      out.push_back(std::move(s));
    } else if (k == "set") {
      next();
      const Token& at = cur();
      std::string first = expect_name("a variable name after 'set'");
      auto s = stmt_node(StmtKind::Set, kw);
      s->targets.push_back(first);
      if (is_op(".")) {
        next();
        s->text = expect_name("an attribute name");
      } else {
        while (is_op(",")) {
          next();
          s->targets.push_back(expect_name("a variable name"));
        }
      }
      if (is_op("=")) {
        next();
        s->expr = parse_tuple();
        expect_block_end("set");
      } else if (cur().type == Tok::BlockEnd && s->targets.size() == 1 && s->text.empty()) {
        next();
        s->kind = StmtKind::SetBlock;
        s->body = parse_body({"endset"}, end);
        expect_block_end("endset");
      } else {
        error(at, "expected '=' in 'set', got " + describe(cur()));
      }
      out.push_back(std::move(s));
    } else if (k == "macro") {
      next();
      auto s = stmt_node(StmtKind::Macro, kw);
      s->text = expect_name("a macro name");
      parse_params(*s);
      expect_block_end("macro");
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_body({"endmacro"}, end);
      loop_depth_ = saved;
      expect_block_end("endmacro");
      out.push_back(std::move(s));
    } else if (k == "call") {
      next();
      auto s = stmt_node(StmtKind::CallBlock, kw);
      if (is_op("(")) parse_params(*s);
      s->expr = parse_expression();
      if (s->expr->kind != ExprKind::Call) error(kw, "'call' block needs a macro call");
      expect_block_end("call");
      s->body = parse_body({"endcall"}, end);
      expect_block_end("endcall");
      out.push_back(std::move(s));
    } else if (k == "filter") {
      next();
      auto s = stmt_node(StmtKind::FilterBlock, kw);
      s->expr = parse_filter_chain(nullptr, kw);
      expect_block_end("filter");
      s->body = parse_body({"endfilter"}, end);
      expect_block_end("endfilter");
      out.push_back(std::move(s));
    } else if (k == "with") {
      next();
      auto s = stmt_node(StmtKind::With, kw);
      while (cur().type != Tok::BlockEnd) {
        if (!s->targets.empty()) expect_op(",");
        s->targets.push_back(expect_name("a variable name in 'with'"));
        expect_op("=");
        s->conds.push_back(parse_expression());
      }
      expect_block_end("with");
      s->body = parse_body({"endwith"}, end);
      expect_block_end("endwith");
      out.push_back(std::move(s));
    } else if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) error(kw, "'" + k + "' outside of a loop");
      next();
      out.push_back(stmt_node(k == "break" ? StmtKind::Break : StmtKind::Continue, kw));
      expect_block_end(k.c_str());
    } else if (k == "generation") {
      // transformers' AssistantTracker extension: renders its body unchanged.
      next();
      expect_block_end("generation");
      Body b = parse_body({"endgeneration"}, end);
      expect_block_end("endgeneration");
      for (auto& st : b) out.push_back(std::move(st));
    } else if (k == "elif" || k == "else" || k.rfind("end", 0) == 0) {
      error(kw, "unexpected '" + k + "' (no matching opening statement)");
    } else {
      error(kw, "unsupported statement '" + k + "'");
    }
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) next();
    names.push_back(expect_name("a loop variable name"));
    while (is_op(",")) {
      next();
      names.push_back(expect_name("a loop variable name"));
    }
    if (paren) expect_op(")");
    return names;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      s.params.push_back(expect_name("a parameter name"));
      if (is_op("=")) {
        next();
        s.conds.push_back(parse_expression());
      } else {
        s.conds.push_back(nullptr);
      }
    }
    next();
  }

  // ---- expressions ---------------------------------------------------------------------------
  ExprPtr parse_tuple() {
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

  ExprPtr parse_expression() {
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

  ExprPtr binary(const Token& at, const std::string& op, ExprPtr l, ExprPtr r) {
    auto b = expr_node(ExprKind::Binary, at);
    b->name = op;
    b->items.push_back(std::move(l));
    b->items.push_back(std::move(r));
    return b;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const Token& at = next();
      l = binary(at, "or", std::move(l), parse_and());
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const Token& at = next();
      l = binary(at, "and", std::move(l), parse_not());
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const Token& at = next();
      auto u = expr_node(ExprKind::Unary, at);
      u->name = "not";
      u->items.push_back(parse_not());
      return u;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
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
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      l = binary(at, at.text, std::move(l), parse_concat());
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      const Token& at = next();
      l = binary(at, "~", std::move(l), parse_math2());
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      l = binary(at, at.text, std::move(l), parse_pow());
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      const Token& at = next();
      l = binary(at, "**", std::move(l), parse_unary(true));
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
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

  ExprPtr parse_primary() {
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

  ExprPtr parse_postfix(ExprPtr node) {
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

  ExprPtr parse_subscript(ExprPtr obj, const Token& at) {
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

  void parse_args(Expr& call) {
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

  ExprPtr parse_call(ExprPtr callee, const Token& at) {
    auto e = expr_node(ExprKind::Call, at);
    e->line = callee->line;  // errors point at what is called, not at '('
    e->col = callee->col;
    e->items.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name("a filter or test name");
    while (is_op(".") && peek().type == Tok::Name) {
      next();
      n += "." + next().text;
    }
    return n;
  }

  // `| name(args)` chain; with node == nullptr builds a chain applied to a placeholder (filter blocks).
  ExprPtr parse_filter_chain(ExprPtr node, const Token& at) {
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

  ExprPtr parse_filter_expr(ExprPtr node) {
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
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(lex_template(source)).parse_all(); }

}  // namespace nf4flash::chat
