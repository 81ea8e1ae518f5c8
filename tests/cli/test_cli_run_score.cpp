// CLI behaviour of run/score/chat: text in and out, JSON shape, and bad input giving one clear
// error line with a non-zero exit (never a crash).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace nf4flash::test;
namespace fs = std::filesystem;

namespace {

const std::string kLlama2 = model_dir("llama2-tok-hd64");
const std::string kGqa = model_dir("llama-gqa-hd64");

void expect_one_error_line(const CliResult& r, const std::string& must_contain) {
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.code, 139) << "crashed";
  // progress lines may precede it; the error itself is exactly one line, the last one
  const size_t at = r.err.rfind("error: ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_TRUE(at == 0 || r.err[at - 1] == '\n') << r.err;
  EXPECT_EQ(r.err.find("error: "), at) << r.err;
  EXPECT_EQ(count_lines(r.err.substr(at)), 1) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << r.err;
}

TEST(CliRunScore, ScoreJsonHasTheDocumentedFields) {
  Golden g("llama-gqa-hd64");
  const auto toks = g.i32("tokens_0");
  std::string list;
  for (size_t i = 0; i < toks.size(); ++i) list += (i ? "," : "") + std::to_string(toks[i]);
  const CliResult r = run_cli("score -q --device cpu --model " + kGqa + " --tokens " + list + " --json --last-logits");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["n_tokens"], toks.size());
  ASSERT_EQ(j["next_token_logprobs"].size(), toks.size() - 1);
  EXPECT_EQ(j["last_logits"].size(), 1024u);
  const auto ref = g.f32("nextlogprob_f32_0");
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(j["next_token_logprobs"][i].get<double>(), ref[i], 1e-3);
  EXPECT_GT(j["perplexity"].get<double>(), 1.0);
}

TEST(CliRunScore, RunStreamsTextAndEndsWithASummaryLine) {
  const CliResult r = run_cli("run --device cpu --model " + kLlama2 + " --prompt 'Hello world' -n 8 --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_NE(r.err.find("prefill: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("| decode: 7 tok at"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("attn="), std::string::npos) << r.err;
  // the load line says how long the weights and the tokenizer took, and the rate over the files
  EXPECT_NE(r.err.find(" GB safetensors) | weights "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" GB/s of "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" | tokenizer "), std::string::npos) << r.err;
}

TEST(CliRunScore, RunWithTokensEqualsRunWithTheSameTextTokenized) {
  const CliResult a = run_cli("tokenize --model " + kLlama2 + " --text 'Hello world' --add-special-tokens --json");
  ASSERT_EQ(a.code, 0) << a.err;
  std::string list;
  const auto tokenized = nlohmann::json::parse(a.out);
  for (const auto& id : tokenized["ids"]) list += (list.empty() ? "" : ",") + std::to_string(id.get<int>());
  const CliResult ids = run_cli("run -q --device cpu --model " + kLlama2 + " --prompt-tokens " + list + " -n 6 --ignore-eos --ids");
  const CliResult text = run_cli("run -q --device cpu --model " + kLlama2 + " --prompt 'Hello world' -n 6 --ignore-eos --ids");
  ASSERT_EQ(ids.code, 0) << ids.err;
  EXPECT_EQ(ids.out, text.out);
  EXPECT_EQ(std::count(ids.out.begin(), ids.out.end(), ','), 5);
}

TEST(CliRunScore, SamplingIsSeededAndRepeatable) {
  const std::string cmd = "run -q --device cpu --model " + kGqa + " --prompt-tokens 5,6,7 -n 12 --ignore-eos --temperature 0.9 --top-k 40 --top-p 0.95 --min-p 0.01 --repeat-penalty 1.1 --seed 7";
  const CliResult a = run_cli(cmd), b = run_cli(cmd);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}

TEST(CliRunScore, ChatNeedsATemplate) {
  // the llama2 fixture has tokenizer files but its tokenizer_config.json carries no chat_template
  const CliResult r = run_cli("run --device cpu --model " + kLlama2 + " --chat --prompt hi -n 2");
  expect_one_error_line(r, "chat template");
}

TEST(CliRunScore, BadInputIsOneClearErrorLine) {
  expect_one_error_line(run_cli("score --device cpu --model /nonexistent --tokens 1,2"), "/nonexistent");
  expect_one_error_line(run_cli("score --device cpu --model " + kGqa + " --tokens 1,99999"), "outside the vocabulary");
  expect_one_error_line(run_cli("score --device cpu --model " + kGqa + " --tokens 1,x"), "--tokens");
  expect_one_error_line(run_cli("run --device cpu --model " + kGqa + " --prompt-tokens 1,2 --ctx-size 1 -n 4"), "context size");
  expect_one_error_line(run_cli("run --device cpu --model " + kGqa + " --prompt-tokens 1,2 --attn flash -n 4"), "--attn flash");
  expect_one_error_line(run_cli("run --device cpu --model " + kGqa + " --prompt-tokens 1,2 --double-quant -n 4"), "--double-quant");
  expect_one_error_line(run_cli("run --device cpu --model " + kGqa + " --prompt-tokens 1,2 --quant nf4 --blocksize 48 -n 4"), "--blocksize");
  expect_one_error_line(run_cli("run --device cpu --model " + kGqa + " --prompt 'no tokenizer here' -n 4"), "tokenizer.json");
  // CLI11 range checks are also non-zero exits
  EXPECT_NE(run_cli("run --device cpu --model " + kGqa + " --prompt-tokens 1 --top-p 2").code, 0);
}

TEST(CliRunScore, BrokenCheckpointsAreRefusedByName) {
  const TempDir tmp("nf4flash_cli_run");
  // an unknown architecture
  const fs::path d1 = tmp.path / "arch";
  fs::copy(kGqa, d1, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  {
    std::ifstream in(d1 / "config.json");
    auto cfg = nlohmann::json::parse(in);
    cfg["architectures"] = {"GPTNeoXForCausalLM"};
    std::ofstream(d1 / "config.json") << cfg.dump();
  }
  expect_one_error_line(run_cli("score --device cpu --model " + d1.string() + " --tokens 1,2"), "GPTNeoXForCausalLM");
  // an unsupported rope type
  {
    std::ifstream in(d1 / "config.json");
    auto cfg = nlohmann::json::parse(in);
    cfg["architectures"] = {"LlamaForCausalLM"};
    cfg["rope_scaling"] = {{"rope_type", "ntk-by-parts"}, {"factor", 4.0}};
    std::ofstream(d1 / "config.json") << cfg.dump();
  }
  expect_one_error_line(run_cli("score --device cpu --model " + d1.string() + " --tokens 1,2"), "ntk-by-parts");
  // a truncated safetensors file
  const fs::path d2 = tmp.path / "trunc";
  fs::copy(kGqa, d2, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  fs::resize_file(d2 / "model.safetensors", fs::file_size(d2 / "model.safetensors") / 2);
  expect_one_error_line(run_cli("score --device cpu --model " + d2.string() + " --tokens 1,2"), "model.safetensors");
  // a header that is not JSON
  {
    std::ofstream(d2 / "model.safetensors", std::ios::binary | std::ios::trunc) << std::string("\x10\0\0\0\0\0\0\0{not json!!!!!!}", 24);
  }
  expect_one_error_line(run_cli("score --device cpu --model " + d2.string() + " --tokens 1,2"), "not valid JSON");
}


TEST(CliRunScore, Llama2FixturePrintsTheDecodingOfTransformersGreedyIds) {
  Golden g("llama2-tok-hd64");
  const auto prompt = g.i32("tokens_1"), want = g.i32("greedy_f32_from_1");
  std::string plist, wlist;
  for (size_t i = 0; i < prompt.size(); ++i) plist += (i ? "," : "") + std::to_string(prompt[i]);
  for (size_t i = 0; i < want.size(); ++i) wlist += (i ? "," : "") + std::to_string(want[i]);
  const std::string base = "run -q --device cpu --model " + kLlama2 + " --prompt-tokens " + plist + " -n 24 --ignore-eos";
  const CliResult ids = run_cli(base + " --ids");
  ASSERT_EQ(ids.code, 0) << ids.err;
  EXPECT_EQ(ids.out, wlist + "\n");
  const CliResult text = run_cli(base);
  const CliResult dec = run_cli("tokenize --model " + kLlama2 + " --decode --skip-special-tokens --text " + wlist);
  ASSERT_EQ(text.code, 0) << text.err;
  ASSERT_EQ(dec.code, 0) << dec.err;
  EXPECT_FALSE(text.out.empty());
  EXPECT_EQ(text.out, dec.out.back() == '\n' ? dec.out : dec.out + "\n");
}

}  // namespace
