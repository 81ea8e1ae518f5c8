// Chat-template parser, statements (see parser.h): the template body (text, {{ }} and {% %} tags)
// and each block statement (if/for/set/macro/call/filter/with/break/continue/generation), with
// their loop targets and macro parameters. Expressions are parsed in parser_expressions.cpp.
#include "chat/parser.h"

#include "chat/parser_internal.h"

namespace nf4flash::chat {
namespace detail {

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

// Parses until a block tag named in `ends` (left unconsumed after '{%'; its name goes to `end`).
Body Parser::parse_body(const std::set<std::string>& ends, std::string& end) {
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

void Parser::parse_statement(Body& out) {
  const Token& kw = cur();
  if (kw.type != Tok::Name) error(kw, "expected a statement name after '{%', got " + describe(kw));
  const std::string k = kw.text;
  std::string end;
  if (open_stack_.size() >= size_t(kMaxNesting)) error(kw, "blocks nested more than 200 levels deep");
  open_stack_.push_back(&kw);
  parse_statement_body(kw, k, end, out);
  open_stack_.pop_back();
}

void Parser::parse_statement_body(const Token& kw, const std::string& k, std::string& end, Body& out) {
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

std::vector<std::string> Parser::parse_targets() {
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

void Parser::parse_params(Stmt& s) {
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

}  // namespace detail

Body parse_template(const std::string& source) { return detail::Parser(lex_template(source)).parse_all(); }

}  // namespace nf4flash::chat
