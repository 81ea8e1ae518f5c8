// Tokenizer building blocks: NFC/NFD, Rust-compatible lossy UTF-8, code point classes and the
// hand-written Split matchers on the regex corner cases (contractions, digit groups, whitespace
// runs before a word or at the end, newlines).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"

namespace nf4flash::tok {
namespace {

std::vector<std::string> split_all(SplitRegex re, const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t e = split_match(re, s, i);
    if (e == i) e = i + 1;
    out.push_back(s.substr(i, e - i));
    i = e;
  }
  return out;
}

TEST(TokenizerUnicode, Nfc) {
  EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");                       // e + acute -> é
  EXPECT_EQ(nfc("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"), "\xED\x95\x9C");  // jamo -> 한
  EXPECT_EQ(nfc("o\xCC\xA3\xCC\x82"), "\xE1\xBB\x99");            // o + dot below + circumflex -> ộ
  EXPECT_EQ(nfc("o\xCC\x82\xCC\xA3"), "\xE1\xBB\x99");            // marks in the other order too
  EXPECT_EQ(nfc("\xE2\x84\xAB"), "\xC3\x85");                     // ANGSTROM SIGN -> Å (singleton)
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_TRUE(nfc_quick_yes("한국어 text"));
  EXPECT_FALSE(nfc_quick_yes("e\xCC\x81"));
  EXPECT_EQ(nfd("\xC3\xA9"), "e\xCC\x81");
}

TEST(TokenizerUnicode, LossyUtf8LikeRust) {
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  EXPECT_EQ(utf8_lossy("a\xF0\x90\x80" "b"), "a\xEF\xBF\xBD" "b");              // truncated: one U+FFFD
  EXPECT_EQ(utf8_lossy("\xE0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");                // E0 80: two
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: three
  EXPECT_EQ(utf8_lossy("\xFF"), "\xEF\xBF\xBD");
  EXPECT_TRUE(utf8_valid("\xF0\x9F\x99\x82"));
}

TEST(TokenizerUnicode, Classes) {
  EXPECT_EQ(cp_class('a'), kClsLetter);
  EXPECT_EQ(cp_class('7'), kClsNumber);
  EXPECT_EQ(cp_class(0x00BD), kClsNumber);  // ½ is No
  EXPECT_EQ(cp_class(0xD55C), kClsLetter);  // 한
  EXPECT_EQ(cp_class(0x3000), kClsSpace);
  EXPECT_EQ(cp_class(0x0301), kClsMark);
  EXPECT_EQ(cp_class(0x200B), 0);  // ZERO WIDTH SPACE is not White_Space
}

TEST(TokenizerUnicode, SplitMatchers) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_all(SplitRegex::kLlama3, "don't DON'T"), (V{"don", "'t", " DON", "'T"}));
  EXPECT_EQ(split_all(SplitRegex::kGpt2, "DON'T"), (V{"DON", "'", "T"}));  // case-sensitive
  EXPECT_EQ(split_all(SplitRegex::kLlama3, "12345"), (V{"123", "45"}));
  EXPECT_EQ(split_all(SplitRegex::kQwen2, "123"), (V{"1", "2", "3"}));
  EXPECT_EQ(split_all(SplitRegex::kLlama3, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split_all(SplitRegex::kLlama3, "a  "), (V{"a", "  "}));
  EXPECT_EQ(split_all(SplitRegex::kLlama3, "x \n\n y"), (V{"x", " \n\n", " y"}));
  EXPECT_EQ(split_all(SplitRegex::kLlama3, "?!\n\nok"), (V{"?!\n\n", "ok"}));
  EXPECT_EQ(split_all(SplitRegex::kLlama3, "\tword"), (V{"\tword"}));
}

}  // namespace
}  // namespace nf4flash::tok
