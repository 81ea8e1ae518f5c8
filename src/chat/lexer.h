// Chat-template lexer: splits Jinja source into data and tag tokens with the whitespace rules
// transformers renders with (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
// `{%-`/`-%}`, `{{-`/`-}}`, `{#-`/`-#}` strip whitespace; `{%+`/`+%}` opt out; the first newline
// after a block or comment tag is dropped; spaces/tabs before a block/comment tag on its own line
// are dropped; `{% raw %}` ... `{% endraw %}` is passed through as data.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace nf4flash::chat {

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // data text, name, decoded string literal, or operator spelling
  int64_t ival = 0;
  double fval = 0;
  int line = 1;
  int col = 1;
};

std::vector<Token> lex_template(const std::string& source);

}  // namespace nf4flash::chat
