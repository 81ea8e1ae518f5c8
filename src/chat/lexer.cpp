// Chat-template lexer (see lexer.h). Mirrors jinja2.lexer's root/tag states closely enough that
// whitespace handling matches byte for byte on the templates found on the hub.
#include "chat/lexer.h"

#include <algorithm>
#include <cstring>

#include "chat/strutil.h"
#include "core/error.h"

namespace nf4flash::chat {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  explicit Lexer(std::string src) : s_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < s_.size(); ++i)
      if (s_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < s_.size()) {
      size_t hit = find_open(pos);
      if (hit == std::string::npos) {
        push_data(s_.substr(pos), pos);
        break;
      }
      char kind = s_[hit + 1];
      char sign = hit + 2 < s_.size() && (s_[hit + 2] == '-' || s_[hit + 2] == '+') ? s_[hit + 2] : 0;
      std::string text = s_.substr(pos, hit - pos);
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool only_blank = std::all_of(text.begin() + l_pos, text.end(), [](char c) { return c == ' ' || c == '\t'; });
          if (only_blank) text.resize(l_pos);
        }
      }
      push_data(text, pos);
      size_t inner = hit + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        pos = lex_comment(hit, inner);
      } else if (kind == '%' && is_raw(inner)) {
        pos = lex_raw(hit, inner);
      } else {
        pos = lex_tag(hit, inner, kind == '%');
      }
      line_starting = pos > 0 && s_[pos - 1] == '\n';
    }
    Token eof{Tok::Eof, "", 0, 0, 0, 0};
    position(s_.size(), eof);
    out_.push_back(eof);
    return std::move(out_);
  }

 private:
  std::string s_;
  std::vector<size_t> line_starts_;
  std::vector<Token> out_;

  void position(size_t off, Token& t) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), off);
    size_t ls = *(it - 1);
    t.line = static_cast<int>(it - line_starts_.begin());
    t.col = static_cast<int>(utf8_length(std::string_view(s_).substr(ls, off - ls))) + 1;
  }

  [[noreturn]] void error_at(size_t off, const std::string& msg) const {
    Token t;
    position(off, t);
    fail("chat template: line ", t.line, ":", t.col, ": ", msg);
  }

  size_t find_open(size_t pos) const {
    while (true) {
      size_t h = s_.find('{', pos);
      if (h == std::string::npos || h + 1 >= s_.size()) return std::string::npos;
      char c = s_[h + 1];
      if (c == '{' || c == '%' || c == '#') return h;
      pos = h + 1;
    }
  }

  void push_data(const std::string& text, size_t off) {
    if (text.empty()) return;
    Token t{Tok::Data, text};
    position(off, t);
    out_.push_back(std::move(t));
  }

  void push(Tok type, size_t off, std::string text = {}) {
    Token t{type, std::move(text)};
    position(off, t);
    out_.push_back(std::move(t));
  }

  // After a block/comment end marker at `p` (pointing at '%' or '#' of the closing pair, with the
  // optional sign before it already handled): returns where the following data starts.
  size_t after_end(size_t close_end, char sign) const {
    size_t p = close_end;
    if (sign == '-') {
      while (p < s_.size() && is_ws(s_[p])) ++p;
    } else if (sign != '+' && p < s_.size() && s_[p] == '\n') {
      ++p;  // trim_blocks
    }
    return p;
  }

  size_t lex_comment(size_t open, size_t inner) {
    size_t e = s_.find("#}", inner);
    if (e == std::string::npos) error_at(open, "unclosed comment '{#'");
    char sign = e > inner && (s_[e - 1] == '-' || s_[e - 1] == '+') ? s_[e - 1] : 0;
    return after_end(e + 2, sign);
  }

  bool is_raw(size_t p) const {
    while (p < s_.size() && is_ws(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < s_.size() && is_name_char(s_[p])) return false;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    return s_.compare(p, 2, "%}") == 0 || s_.compare(p, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t open, size_t p) {
    while (is_ws(s_[p])) ++p;
    p += 3;
    while (is_ws(s_[p])) ++p;
    if (s_[p] == '-') {
      p += 3;
      while (p < s_.size() && is_ws(s_[p])) ++p;
    } else {
      p += 2;  // no trim_blocks newline after {% raw %} (as in jinja2)
    }
    // Find "{%[-+]? endraw [-+]?%}".
    size_t q = p;
    while (true) {
      size_t h = s_.find("{%", q);
      if (h == std::string::npos) error_at(open, "unclosed '{% raw %}' (missing '{% endraw %}')");
      size_t r = h + 2;
      char sign = r < s_.size() && (s_[r] == '-' || s_[r] == '+') ? s_[r] : 0;
      if (sign) ++r;
      while (r < s_.size() && is_ws(s_[r])) ++r;
      if (s_.compare(r, 6, "endraw") != 0) { q = h + 2; continue; }
      r += 6;
      while (r < s_.size() && is_ws(s_[r])) ++r;
      char esign = r < s_.size() && (s_[r] == '-' || s_[r] == '+') ? s_[r] : 0;
      if (esign) ++r;
      if (s_.compare(r, 2, "%}") != 0) { q = h + 2; continue; }
      std::string text = s_.substr(p, h - p);
      if (sign == '-') {
        size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      } else if (sign != '+') {
        size_t l_pos = text.rfind('\n');
        if (l_pos != std::string::npos) {
          ++l_pos;
          if (std::all_of(text.begin() + l_pos, text.end(), [](char c) { return c == ' ' || c == '\t'; }))
            text.resize(l_pos);
        }
      }
      push_data(text, p);
      return after_end(r + 2, esign);
    }
  }

  size_t lex_tag(size_t open, size_t p, bool block) {
    push(block ? Tok::BlockBegin : Tok::VarBegin, open);
    int depth = 0;
    const char* end = block ? "%}" : "}}";
    while (true) {
      while (p < s_.size() && is_ws(s_[p])) ++p;
      if (p >= s_.size()) error_at(open, block ? "unclosed tag '{%' (missing '%}')" : "unclosed '{{' (missing '}}')");
      if (depth == 0) {
        char sign = (s_[p] == '-' || (block && s_[p] == '+')) ? s_[p] : 0;
        size_t m = p + (sign ? 1 : 0);
        if (s_.compare(m, 2, end) == 0) {
          push(block ? Tok::BlockEnd : Tok::VarEnd, p);
          if (!block) {
            size_t q = m + 2;
            if (sign == '-')
              while (q < s_.size() && is_ws(s_[q])) ++q;
            return q;
          }
          return after_end(m + 2, sign);
        }
      }
      char c = s_[p];
      if (is_digit(c)) {
        p = lex_number(p);
      } else if (is_name_start(c)) {
        size_t q = p;
        while (q < s_.size() && is_name_char(s_[q])) ++q;
        push(Tok::Name, p, s_.substr(p, q - p));
        p = q;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* t : two)
          if (s_.compare(p, 2, t) == 0) op = t;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}<>=.:|,;", c)) error_at(p, std::string("unexpected character '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) error_at(p, "unexpected '" + op + "'");
          --depth;
        }
        push(Tok::Op, p, op);
        p += op.size();
      }
    }
  }

  size_t digits(size_t p) const {  // (\d+_)*\d+
    size_t q = p;
    while (q < s_.size() && (is_digit(s_[q]) || (s_[q] == '_' && q + 1 < s_.size() && is_digit(s_[q + 1]) && q > p)))
      ++q;
    return q;
  }

  size_t lex_number(size_t p) {
    size_t q = digits(p);
    bool is_float = false;
    if (q + 1 < s_.size() && s_[q] == '.' && is_digit(s_[q + 1])) {
      q = digits(q + 1);
      is_float = true;
    }
    if (q < s_.size() && (s_[q] == 'e' || s_[q] == 'E')) {
      size_t r = q + 1;
      if (r < s_.size() && (s_[r] == '+' || s_[r] == '-')) ++r;
      if (r < s_.size() && is_digit(s_[r])) {
        q = digits(r);
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = p; k < q; ++k)
      if (s_[k] != '_') text += s_[k];
    Token t{is_float ? Tok::Float : Tok::Int, text};
    position(p, t);
    if (is_float) t.fval = std::strtod(text.c_str(), nullptr);
    else {
      errno = 0;
      t.ival = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) error_at(p, "integer literal out of range");
    }
    out_.push_back(std::move(t));
    return q;
  }

  size_t lex_string(size_t p) {
    char q = s_[p];
    std::string v;
    size_t k = p + 1;
    auto hex = [&](size_t at, int n) -> char32_t {
      if (at + n > s_.size()) error_at(at, "truncated escape in string literal");
      char32_t cp = 0;
      for (int i = 0; i < n; ++i) {
        char c = s_[at + i];
        int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) error_at(at, "bad hex escape in string literal");
        cp = cp * 16 + d;
      }
      return cp;
    };
    while (true) {
      if (k >= s_.size()) error_at(p, "unterminated string literal");
      char c = s_[k];
      if (c == q) break;
      if (c != '\\') { v += c; ++k; continue; }
      if (k + 1 >= s_.size()) error_at(p, "unterminated string literal");
      char e = s_[k + 1];
      k += 2;
      switch (e) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'v': v += '\v'; break;
        case '\n': break;  // line continuation
        case 'x': utf8_append(v, hex(k, 2)); k += 2; break;
        case 'u': utf8_append(v, hex(k, 4)); k += 4; break;
        case 'U': utf8_append(v, hex(k, 8)); k += 8; break;
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = e - '0';
            for (int n = 0; n < 2 && k < s_.size() && s_[k] >= '0' && s_[k] <= '7'; ++n) cp = cp * 8 + (s_[k++] - '0');
            utf8_append(v, cp);
          } else {
            v += '\\';  // unknown escapes stay as written (Python unicode-escape keeps them)
            v += e;
          }
      }
    }
    Token t{Tok::String, v};
    position(p, t);
    out_.push_back(std::move(t));
    return k + 1;
  }
};

}  // namespace

std::vector<Token> lex_template(const std::string& source) {
  // Normalize newlines (\r\n, \r -> \n) and drop one trailing newline, as jinja2 does by default.
  std::string s;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s += source[i];
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return Lexer(std::move(s)).run();
}

}  // namespace nf4flash::chat
