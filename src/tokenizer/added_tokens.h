// Added tokens of tokenizer.json ("added_tokens"): matched in the raw text (normalized=false) or
// in each normalized piece (normalized=true) before pre-tokenization, leftmost-longest like the
// Rust library's Aho-Corasick matcher, honouring single_word, lstrip and rstrip.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nf4flash::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, normalized = false, single_word = false;
};

// A split of the input: either an added token (id >= 0) or plain text (id == -1), [begin, end).
struct Split {
  int32_t id;
  size_t begin, end;
};

class AddedTokenMatcher {
 public:
  void build(const std::vector<const AddedToken*>& tokens);
  bool empty() const { return tokens_.empty(); }
  // Splits `text` (see find_matches in the Rust library's added_vocabulary.rs).
  void split(std::string_view text, std::vector<Split>& out) const;
  // True when some token contains `c`.
  bool any_contains(char c) const;

 private:
  // Longest token starting at text[i]: index into tokens_ and length, or -1.
  int longest_at(std::string_view text, size_t i, size_t* len) const;

  struct Node {
    int32_t first_child = -1, next_sibling = -1;
    int32_t token = -1;  // index into tokens_ ending here
    unsigned char byte = 0;
  };
  std::vector<Node> nodes_;
  std::vector<const AddedToken*> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace nf4flash::tok
