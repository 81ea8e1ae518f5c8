// Tokenizer: streaming decode (concatenated output == decode), batch encode == single encode,
// long inputs encoded on several threads == single-threaded, and errors that name the file.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/error.h"
#include "test_tokenizer_common.h"
#include "tokenizer/tokenizer_impl.h"

namespace nf4flash::test {
namespace {

std::string stream_all(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip = false) {
  StreamDecoder sd(tok, skip);
  std::string out;
  for (int32_t id : ids) out += sd.push(id);
  out += sd.flush();
  return out;
}

class TokenizerStream : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerStream, ConcatenationEqualsDecode) {
  const Tokenizer& tok = fixture_tokenizer(GetParam());
  std::vector<int32_t> all;
  for (const auto& c : golden_cases(GetParam())) {
    EXPECT_EQ(stream_all(tok, c.ids), tok.decode(c.ids)) << c.text;
    EXPECT_EQ(stream_all(tok, c.ids_with_special, true), tok.decode(c.ids_with_special, true)) << c.text;
    all.insert(all.end(), c.ids.begin(), c.ids.end());
  }
  EXPECT_EQ(stream_all(tok, all), tok.decode(all));
}

TEST_P(TokenizerStream, HoldsIncompleteUtf8) {
  const Tokenizer& tok = fixture_tokenizer(GetParam());
  // Korean and emoji: llama2 spells them with byte-fallback tokens, byte-level BPE with partial
  // byte tokens; no push may return a broken character.
  auto ids = tok.encode("🙂 점검 🇰🇷", false);
  StreamDecoder sd(tok);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = sd.push(id);
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos);
    out += piece;
  }
  out += sd.flush();
  EXPECT_EQ(out, tok.decode(ids));
}

TEST_P(TokenizerStream, BatchEqualsSingle) {
  const Tokenizer& tok = fixture_tokenizer(GetParam());
  std::vector<std::string> texts;
  for (const auto& c : golden_cases(GetParam())) texts.push_back(c.text);
  auto batch = tok.encode_batch(texts, true, 2);
  ASSERT_EQ(batch.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(batch[i], tok.encode_single_thread(texts[i], true));
}

TEST_P(TokenizerStream, LongInputParallelEqualsSingle) {
  const Tokenizer& tok = fixture_tokenizer(GetParam());
  std::string text;
  int k = 0;
  while (text.size() < 400 * 1024) {
    for (const auto& c : golden_cases(GetParam())) {
      text += c.text;
      text += (++k % 7 == 0) ? "\n\n" : (k % 3 == 0 ? "  " : " ");
    }
  }
  auto single = tok.encode_single_thread(text, true);
  EXPECT_TRUE(tok.impl().chunkable());
  std::vector<int32_t> parallel;
  tok.impl().encode_parallel(text, parallel, 4);
  tok.impl().add_special(parallel);
  EXPECT_EQ(parallel.size(), single.size());
  EXPECT_TRUE(parallel == single);
  EXPECT_TRUE(tok.encode(text, true) == single);  // the public entry point (pool-sized threads)
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, TokenizerStream, ::testing::Values("llama3", "qwen3", "llama2"),
                         [](const auto& info) { return info.param; });

void expect_error_naming(const std::string& path, const std::string& fragment) {
  try {
    Tokenizer::from_files(path, "");
    FAIL() << "no error for " << path;
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << msg;
  }
}

TEST(TokenizerErrors, NameTheFile) {
  const TempDir tmp("nf4flash_tok");
  auto write_temp = [&](const std::string& name, const std::string& content) { return tmp.file(name, content).string(); };
  expect_error_naming(write_temp("bad.json", "{ this is not json"), "invalid JSON");
  expect_error_naming(write_temp("nomodel.json", "{\"added_tokens\": []}"), "model");
  expect_error_naming(write_temp("wordpiece.json", R"({"model": {"type": "WordPiece", "vocab": {}}})"), "WordPiece");
  expect_error_naming(
      write_temp("regex.json",
                 R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                     "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Isolated", "invert": false}})"),
      "[a-z]+");
  expect_error_naming(write_temp("merge.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"),
                      "merges");
  expect_error_naming("/nonexistent/tokenizer.json", "cannot open");
  expect_error_naming(tmp.path.string(), "is a directory");
  // model.vocab and model.merges are read by the streaming parser: each malformed entry named
  expect_error_naming(write_temp("vocab-str.json", R"({"model": {"type": "BPE", "vocab": {"a": "0"}, "merges": []}})"),
                      "model.vocab entry 'a' is not an integer id");
  expect_error_naming(write_temp("vocab-obj.json", R"({"model": {"type": "BPE", "vocab": {"a": {}}, "merges": []}})"),
                      "model.vocab entry 'a'");
  expect_error_naming(write_temp("vocab-arr.json", R"({"model": {"type": "BPE", "vocab": ["a"], "merges": []}})"),
                      "model.vocab is not an object");
  expect_error_naming(write_temp("merge-nospace.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}})"),
                      "merges entry 0 ('ab') is not two tokens");
  expect_error_naming(write_temp("merge-three.json",
                                 R"({"model": {"type": "BPE", "vocab": {"a": 0, "aa": 1}, "merges": ["a a", ["a", "a", "a"]]}})"),
                      "merges entry 1 is neither");
  expect_error_naming(write_temp("merge-num.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [1]}})"),
                      "merges entry 0 is neither");
  expect_error_naming(write_temp("merge-obj.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": {}}})"),
                      "model.merges is not an array");
  EXPECT_THROW(Tokenizer::from_dir("/nonexistent-dir"), Error);
}

}  // namespace
}  // namespace nf4flash::test

namespace nf4flash::test {
namespace {

// token_text keeps the leading space a SentencePiece decoder strips from a sequence's first token,
// and the token texts of a sequence concatenate to what that sequence adds after "a".
TEST(TokenizerTokenText, KeepsTheLeadingSpace) {
  const Tokenizer& l2 = fixture_tokenizer("llama2");
  const int32_t hello = l2.token_to_id("\xE2\x96\x81Hello");  // "▁Hello"
  ASSERT_GE(hello, 0);
  EXPECT_EQ(l2.decode({hello}), "Hello");
  EXPECT_EQ(l2.token_text(hello), " Hello");
  const Tokenizer& l3 = fixture_tokenizer("llama3");
  const int32_t ghello = l3.token_to_id("\xC4\xA0Hello");  // "ĠHello"
  ASSERT_GE(ghello, 0);
  EXPECT_EQ(l3.token_text(ghello), " Hello");
  for (const char* name : {"llama2", "llama3", "qwen3"}) {
    const Tokenizer& tok = fixture_tokenizer(name);
    const std::vector<int32_t> ids = tok.encode("Hello world, this is a test.", false);
    std::string cat;
    for (int32_t id : ids) cat += tok.token_text(id);
    std::vector<int32_t> with_a = tok.encode("a", false);
    ASSERT_EQ(with_a.size(), 1u) << name;
    const std::string a_text = tok.decode(with_a);
    with_a.insert(with_a.end(), ids.begin(), ids.end());
    EXPECT_EQ(cat, tok.decode(with_a).substr(a_text.size())) << name;
  }
}

}  // namespace
}  // namespace nf4flash::test
