// nf4flash batch on the CPU: every result equals the same prompt run alone with `run` (greedy,
// text and token count) for --quant none and nf4, with a batch smaller than the number of prompts;
// a rerun skips the ids done and redoes one whose line was cut; bad lines are reported with their
// line numbers (fatal unless --skip-bad-lines); stop strings cut the text; max_new_tokens 0.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "core/error.h"

using namespace nf4flash::test;
using nf4flash::cat;

namespace {

const std::string kModel = model_dir("llama2-tok-hd64");
const char* kPrompts[] = {"The capital of France is", "Once upon a time", "One two three four five six", "Paris is",
                          "A B C"};

std::map<std::string, nlohmann::json> results(const std::string& path) {
  std::map<std::string, nlohmann::json> m;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(m.count(j["id"].get<std::string>()), 0u) << "id written twice: " << line;
    m[j["id"].get<std::string>()] = j;
  }
  return m;
}

std::string input_of_prompts(const TempDir& d) {
  std::string s;
  for (size_t i = 0; i < std::size(kPrompts); ++i)
    s += nlohmann::json{{"id", "p" + std::to_string(i)}, {"prompt", kPrompts[i]}}.dump() + "\n";
  return d.file("in.jsonl", s).string();
}

TEST(CliBatch, EachResultEqualsTheSamePromptRunAlone) {
  for (const char* quant : {"none", "nf4"}) {
    SCOPED_TRACE(quant);
    TempDir d("nf4flash_batch");
    const std::string flags = cat(" --model ", kModel, " --device cpu --quant ", quant, " --max-new-tokens 8 --ignore-eos");
    const CliResult r = run_cli(cat("batch", flags, " --input ", input_of_prompts(d), " --output ", d / "out.jsonl",
                                    " --max-batch 2 --step-tokens 8"));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto got = results(d / "out.jsonl");
    ASSERT_EQ(got.size(), std::size(kPrompts));
    for (size_t i = 0; i < std::size(kPrompts); ++i) {
      const CliResult alone = run_cli(cat("run", flags, " -q --prompt '", kPrompts[i], "'"));
      ASSERT_EQ(alone.code, 0) << alone.err;
      std::string text = alone.out;
      if (!text.empty() && text.back() == '\n') text.pop_back();
      const nlohmann::json& j = got.at("p" + std::to_string(i));
      EXPECT_EQ(j["text"], text) << kPrompts[i];
      EXPECT_EQ(j["completion_tokens"], 8);
      EXPECT_EQ(j["finish_reason"], "length");
      EXPECT_GT(j["prompt_tokens"].get<int>(), 0);
    }
  }
}

TEST(CliBatch, RerunSkipsDoneIdsAndRedoesACutLine) {
  TempDir d("nf4flash_batch");
  const std::string in = input_of_prompts(d), out = d / "out.jsonl";
  const std::string cmd = cat("batch --model ", kModel, " --device cpu --max-new-tokens 4 --ignore-eos --input ", in,
                              " --output ", out);
  ASSERT_EQ(run_cli(cmd).code, 0);
  const auto first = results(out);
  // cut the last line in the middle, as an interrupted run leaves it
  std::string all = slurp(out);
  all.pop_back();
  const size_t last = all.rfind('\n') + 1;
  const std::string cut_id = nlohmann::json::parse(all.substr(last))["id"];
  all = all.substr(0, last + 10);
  std::ofstream(out, std::ios::trunc | std::ios::binary) << all;
  const CliResult r = run_cli(cmd);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("4 done already, 1 to run"), std::string::npos) << r.err;
  const auto again = results(out);
  EXPECT_EQ(again, first) << "the rerun's results differ (or an id is missing or doubled)";
  EXPECT_EQ(count_lines(slurp(out)), int(std::size(kPrompts)));
  // everything done: nothing runs, nothing is written
  const CliResult none = run_cli(cmd);
  EXPECT_EQ(none.code, 0);
  EXPECT_NE(none.err.find("0 to run"), std::string::npos) << none.err;
  EXPECT_EQ(count_lines(slurp(out)), int(std::size(kPrompts)));
  (void)cut_id;
}

TEST(CliBatch, BadLinesAreReportedWithTheirNumbers) {
  TempDir d("nf4flash_batch");
  const auto in = d.file("in.jsonl",
                         "{\"id\": \"a\", \"prompt\": \"Hello\"}\n"
                         "{\"id\": \"b\", \"prompt\": \"x\", \"temperature\": \"hot\"}\n"
                         "{\"id\": \"a\", \"prompt\": \"again\"}\n");
  const std::string cmd =
      cat("batch --model ", kModel, " --device cpu --max-new-tokens 2 --input ", in.string(), " --output ", d / "out.jsonl");
  CliResult r = run_cli(cmd);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("in.jsonl:2: \"temperature\""), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in.jsonl:3: \"id\" a was used on an earlier line"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(d / "out.jsonl") && !slurp(d / "out.jsonl").empty());
  r = run_cli(cmd + " --skip-bad-lines");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(results(d / "out.jsonl").size(), 1u);
}

TEST(CliBatch, StopStringsAndMaxNewTokensZero) {
  TempDir d("nf4flash_batch");
  // the greedy output of the first prompt is known from `run`; stop at a word inside it
  const CliResult alone = run_cli(cat("run --model ", kModel, " --device cpu -q --max-new-tokens 8 --ignore-eos --prompt '",
                                      kPrompts[0], "'"));
  ASSERT_EQ(alone.code, 0);
  std::string text = alone.out;
  if (!text.empty() && text.back() == '\n') text.pop_back();
  ASSERT_GT(text.size(), 6u);
  const std::string stop = text.substr(text.size() / 2, 4);
  const std::string lines =
      nlohmann::json{{"id", "s"}, {"prompt", kPrompts[0]}, {"stop", {"never appears", stop}}}.dump() + "\n" +
      nlohmann::json{{"id", "z"}, {"prompt", kPrompts[1]}, {"max_new_tokens", 0}}.dump() + "\n";
  const auto in = d.file("in.jsonl", lines);
  const CliResult r = run_cli(cat("batch --model ", kModel, " --device cpu --max-new-tokens 8 --ignore-eos --input ",
                                  in.string(), " --output ", d / "out.jsonl"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto got = results(d / "out.jsonl");
  EXPECT_EQ(got.at("s")["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(got.at("s")["finish_reason"], "stop");
  EXPECT_EQ(got.at("z")["completion_tokens"], 0);
  EXPECT_EQ(got.at("z")["text"], "");
  EXPECT_EQ(got.at("z")["finish_reason"], "length");
}

}  // namespace
