// Added-token matching (see added_tokens.h).
#include "tokenizer/added_tokens.h"

#include "tokenizer/unicode.h"

namespace nf4flash::tok {
namespace {

// Rust char::is_whitespace is the White_Space property.
bool is_ws(uint32_t cp) { return cp_class(cp) & kClsSpace; }
// A "word" character for single_word: alphanumeric, mark or underscore (regex \w).
bool is_word(uint32_t cp) { return cp == '_' || (cp_class(cp) & (kClsLetter | kClsNumber | kClsMark)); }

uint32_t last_cp(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return utf8_next(s, i);
}

}  // namespace

void AddedTokenMatcher::build(const std::vector<const AddedToken*>& tokens) {
  tokens_.clear();
  nodes_.assign(1, Node{});
  for (const AddedToken* t : tokens) {
    if (t->content.empty()) continue;
    int idx = int(tokens_.size());
    tokens_.push_back(t);
    int cur = 0;
    for (unsigned char c : t->content) {
      int child = nodes_[size_t(cur)].first_child;
      while (child >= 0 && nodes_[size_t(child)].byte != c) child = nodes_[size_t(child)].next_sibling;
      if (child < 0) {
        Node n;
        n.byte = c;
        n.next_sibling = nodes_[size_t(cur)].first_child;
        nodes_.push_back(n);
        child = int(nodes_.size()) - 1;
        nodes_[size_t(cur)].first_child = child;
      }
      cur = child;
    }
    // With duplicate contents the first token wins, as in the Rust library.
    if (nodes_[size_t(cur)].token < 0) nodes_[size_t(cur)].token = idx;
    first_byte_[static_cast<unsigned char>(t->content[0])] = true;
  }
}

bool AddedTokenMatcher::any_contains(char c) const {
  for (const AddedToken* t : tokens_)
    if (t->content.find(c) != std::string::npos) return true;
  return false;
}

int AddedTokenMatcher::longest_at(std::string_view text, size_t i, size_t* len) const {
  int best = -1, cur = 0;
  for (size_t j = i; j < text.size(); ++j) {
    unsigned char c = static_cast<unsigned char>(text[j]);
    int child = nodes_[size_t(cur)].first_child;
    while (child >= 0 && nodes_[size_t(child)].byte != c) child = nodes_[size_t(child)].next_sibling;
    if (child < 0) break;
    cur = child;
    if (nodes_[size_t(cur)].token >= 0) {
      best = nodes_[size_t(cur)].token;
      *len = j + 1 - i;
    }
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Split>& out) const {
  size_t start_offset = 0;
  if (!tokens_.empty()) {
    size_t i = 0;
    while (i < text.size()) {
      if (!first_byte_[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      size_t len = 0;
      int k = longest_at(text, i, &len);
      if (k < 0) {
        ++i;
        continue;
      }
      const AddedToken& t = *tokens_[size_t(k)];
      size_t start = i, stop = i + len;
      i = stop;  // matches do not overlap
      if (t.single_word) {
        bool start_space = start == 0 || !is_word(last_cp(text.substr(0, start)));
        bool stop_space = true;
        if (stop < text.size()) {
          size_t q = stop;
          stop_space = !is_word(utf8_next(text, q));
        }
        if (!start_space || !stop_space) continue;
      }
      if (t.lstrip) {
        size_t ns = start;
        while (ns > 0) {
          size_t q = ns - 1;
          while (q > 0 && (static_cast<unsigned char>(text[q]) & 0xC0) == 0x80) --q;
          size_t r = q;
          if (!is_ws(utf8_next(text, r))) break;
          ns = q;
        }
        start = ns > start_offset ? ns : start_offset;
      }
      if (t.rstrip) {
        while (stop < text.size()) {
          size_t q = stop;
          if (!is_ws(utf8_next(text, q))) break;
          stop = q;
        }
      }
      if (start_offset < start) out.push_back(Split{-1, start_offset, start});
      out.push_back(Split{t.id, start, stop});
      start_offset = stop;
    }
  }
  if (start_offset < text.size()) out.push_back(Split{-1, start_offset, text.size()});
}

}  // namespace nf4flash::tok
