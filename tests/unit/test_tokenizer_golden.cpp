// Tokenizer conformance: ids, ids with special tokens and decoded text must match the
// transformers goldens exactly for llama3, qwen3 and llama2; plus the special-token metadata.
#include <gtest/gtest.h>

#include "test_tokenizer_common.h"

namespace nf4flash::test {
namespace {

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerGolden, MatchesTransformers) {
  const Tokenizer& tok = fixture_tokenizer(GetParam());
  const auto& cases = golden_cases(GetParam());
  ASSERT_GT(cases.size(), 10u);
  int ok = 0;
  for (const auto& c : cases) {
    EXPECT_EQ(tok.encode(c.text, false), c.ids) << "text: " << c.text;
    EXPECT_EQ(tok.encode(c.text, true), c.ids_with_special) << "text: " << c.text;
    EXPECT_EQ(tok.decode(c.ids), c.decoded) << "text: " << c.text;
    ok += tok.encode(c.text, false) == c.ids;
  }
  EXPECT_EQ(ok, int(cases.size()));
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerGolden, ::testing::Values("llama3", "qwen3", "llama2"),
                         [](const auto& info) { return info.param; });

TEST(TokenizerMeta, SpecialTokens) {
  const Tokenizer& l3 = fixture_tokenizer("llama3");
  EXPECT_EQ(l3.vocab_size(), 128256);
  EXPECT_EQ(l3.bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(l3.bos_id(), std::optional<int32_t>(128000));
  EXPECT_EQ(l3.eos_id(), std::optional<int32_t>(128001));
  EXPECT_EQ(l3.token_to_id("<|eot_id|>"), 128009);
  EXPECT_EQ(l3.id_to_token(128009), "<|eot_id|>");
  EXPECT_EQ(l3.token_to_id("no such token"), -1);
  EXPECT_TRUE(l3.is_special(128009));

  const Tokenizer& q3 = fixture_tokenizer("qwen3");
  EXPECT_EQ(q3.vocab_size(), 151669);
  EXPECT_FALSE(q3.bos_id().has_value());
  EXPECT_EQ(q3.bos_token(), "");
  EXPECT_EQ(q3.eos_token(), "<|im_end|>");
  EXPECT_EQ(q3.eos_id(), std::optional<int32_t>(151645));
  EXPECT_FALSE(q3.is_special(q3.token_to_id("<think>")));

  const Tokenizer& l2 = fixture_tokenizer("llama2");
  EXPECT_EQ(l2.vocab_size(), 32000);
  EXPECT_EQ(l2.bos_id(), std::optional<int32_t>(1));
  EXPECT_EQ(l2.eos_id(), std::optional<int32_t>(2));
  EXPECT_EQ(l2.eos_token(), "</s>");
}

TEST(TokenizerMeta, SkipSpecialTokensOnDecode) {
  const Tokenizer& q3 = fixture_tokenizer("qwen3");
  auto ids = q3.encode("<|im_start|>user\nhi<|im_end|>", false);
  EXPECT_EQ(q3.decode(ids, true), "user\nhi");
  const Tokenizer& l2 = fixture_tokenizer("llama2");
  EXPECT_EQ(l2.decode(l2.encode("Hello world", true), true), "Hello world");
}

TEST(TokenizerMeta, InvalidUtf8InputIsReplaced) {
  const Tokenizer& l3 = fixture_tokenizer("llama3");
  EXPECT_EQ(l3.encode(std::string("a\xFF") + "b", false), l3.encode("a\xEF\xBF\xBD" "b", false));
}

}  // namespace
}  // namespace nf4flash::test
