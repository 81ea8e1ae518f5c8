// Chat-template parser internals (not part of the interface; see parser.h): the recursive-descent
// Parser over lexer tokens with its token cursor, error reporting and node construction. Its
// statement rules are in parser_statements.cpp, its expression rules in parser_expressions.cpp.
#pragma once
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"
#include "core/error.h"

namespace nf4flash::chat::detail {

// How a token is named in an error message ("'{%'", "string literal", "end of template", ...).
std::string describe(const Token& t);

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
  // Expressions and blocks nest at most kMaxNesting deep: the parser and the evaluator recurse on
  // them (a template from a download must not overflow the stack).
  static constexpr int kMaxNesting = 200;
  int nest_ = 0;
  struct Nest {
    Parser& p;
    Nest(Parser& parser, const Token& at) : p(parser) {
      if (++p.nest_ > kMaxNesting) {
        --p.nest_;
        p.error(at, "expression nested more than 200 levels deep");
      }
    }
    ~Nest() { --p.nest_; }
  };

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

  // ---- statements (parser_statements.cpp) ----------------------------------------------------
  Body parse_body(const std::set<std::string>& ends, std::string& end);
  void parse_statement(Body& out);
  void parse_statement_body(const Token& kw, const std::string& k, std::string& end, Body& out);
  std::vector<std::string> parse_targets();
  void parse_params(Stmt& s);

  // ---- expressions (parser_expressions.cpp) --------------------------------------------------
  ExprPtr parse_tuple();
  ExprPtr parse_expression();
  ExprPtr binary(const Token& at, const std::string& op, ExprPtr l, ExprPtr r);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr obj, const Token& at);
  void parse_args(Expr& call);
  ExprPtr parse_call(ExprPtr callee, const Token& at);
  std::string dotted_name();
  ExprPtr parse_filter_chain(ExprPtr node, const Token& at);
  ExprPtr parse_filter_expr(ExprPtr node);
};

}  // namespace nf4flash::chat::detail
