// Tensor parallel across processes on the CPU: `--tp N` starts N-1 `nf4flash tp-worker` ranks that
// follow rank 0 over TCP (parallel/tcp_group.h); run, batch, score and bench give what one rank
// gives (greedy ids, batch texts, log-probs within f32 rounding); bad combinations are one error.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"

using namespace nf4flash::test;
using nf4flash::cat;

namespace {

const char* kPromptIds = "1,5,9,14,3,27,8";

std::string run_ids(const std::string& model, const std::string& extra) {
  const CliResult r = run_cli(cat("run -m ", model_dir(model), " --device cpu -t 1 -q --prompt-tokens ", kPromptIds,
                                  " -n 8 --ignore-eos --ids", extra));
  EXPECT_EQ(r.code, 0) << model << extra << ": " << r.err;
  return r.out;
}

TEST(CliTensorParallel, RunAcrossProcessesEqualsOneRank) {
  // dense GQA, biases, fused qkv/gate_up with head_dim 96, soft-capping at head_dim 256, a mixture
  // of experts, and a bitsandbytes NF4 checkpoint
  for (const char* model : {"llama-gqa-hd64", "qwen2-bias", "phi3-longrope-hd96", "gemma2-hd256-softcap",
                            "qwen3moe-topk", "llama3-hd128-ropescaled-bnb-nf4"}) {
    for (const char* compute : {"f32", "bf16"}) {
      const std::string flags = cat(" --compute-dtype ", compute);
      const std::string one = run_ids(model, flags);
      ASSERT_FALSE(one.empty()) << model;
      for (int tp : {2, 4}) EXPECT_EQ(run_ids(model, cat(flags, " --tp ", tp)), one) << model << " " << compute << " tp " << tp;
    }
  }
}

TEST(CliTensorParallel, QuantizedOnLoadAndWithoutCacheEqualOneRank) {
  for (const char* extra : {" --quant nf4 --double-quant", " --quant fp4", " --no-cache"}) {
    const std::string one = run_ids("llama-gqa-hd64", extra);
    EXPECT_EQ(run_ids("llama-gqa-hd64", cat(extra, " --tp 2")), one) << extra;
  }
}

TEST(CliTensorParallel, ScoreAcrossProcessesMatchesOneRank) {
  auto score = [](const std::string& extra) {
    const CliResult r = run_cli(cat("score -m ", model_dir("qwen2-bias"), " --device cpu --compute-dtype f32 -t 1 -q --json",
                                    " --tokens 1,5,9,14,3,27,8,2,11,40", extra));
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto one = score(""), two = score(" --tp 2");
  const auto& a = one["next_token_logprobs"];
  const auto& b = two["next_token_logprobs"];
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i].get<double>(), b[i].get<double>(), 1e-4) << i;
}

TEST(CliTensorParallel, BatchAcrossProcessesEqualsOneRank) {
  const char* prompts[] = {"The capital of France is", "Once upon a time", "One two three", "Paris is", "A B C"};
  TempDir d("nf4flash_tp_batch");
  std::string in;
  for (size_t i = 0; i < std::size(prompts); ++i)
    in += nlohmann::json{{"id", cat("p", i)}, {"prompt", prompts[i]}}.dump() + "\n";
  const std::string input = d.file("in.jsonl", in).string();
  auto batch = [&](const std::string& out, const std::string& extra) {
    const CliResult r = run_cli(cat("batch --model ", model_dir("llama2-tok-hd64"), " --device cpu -t 1 -q --input ", input,
                                    " --output ", d / out, " --max-new-tokens 8 --ignore-eos --max-batch 2 --step-tokens 8", extra));
    EXPECT_EQ(r.code, 0) << r.err;
    std::map<std::string, std::string> m;
    std::ifstream f(d / out);
    std::string line;
    while (std::getline(f, line)) {
      const auto j = nlohmann::json::parse(line);
      m[j["id"].get<std::string>()] = j["text"].get<std::string>();
    }
    return m;
  };
  const auto one = batch("one.jsonl", "");
  ASSERT_EQ(one.size(), std::size(prompts));
  EXPECT_EQ(batch("two.jsonl", " --tp 2"), one);
}

TEST(CliTensorParallel, BenchOfAPresetAcrossProcesses) {
  TempDir d("nf4flash_tp_bench");
  const CliResult r = run_cli(cat("bench --preset tiny --device cpu -t 1 --tp 2 -p 16 -n 4 -r 1 --json ", d / "b.json"));
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream f(d / "b.json");
  const auto j = nlohmann::json::parse(f);
  ASSERT_FALSE(j["configs"].empty());
  const auto& c = j["configs"][0];
  EXPECT_EQ(c["status"], "ok") << c.dump();
  EXPECT_EQ(c["report"]["tp"], 2) << c.dump();
  EXPECT_GT(c["decode"][0]["tok_s"]["median"].get<double>(), 0) << c.dump();
}

TEST(CliTensorParallel, BadCombinationsAreOneError) {
  const std::string m = model_dir("llama-gqa-hd64");
  CliResult r = run_cli(cat("run -m ", m, " --device cpu -q --prompt-tokens 1,2 -n 2 --tp 2 --max-vram 1GiB"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--tp 2 with --gpu-layers / --max-vram"), std::string::npos) << r.err;
  r = run_cli(cat("run -m ", m, " --device cpu -q --prompt-tokens 1,2 -n 2 --tp 2"), "", "WORLD_SIZE=3 RANK=0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--tp 2 but WORLD_SIZE is 3"), std::string::npos) << r.err;
  // rank 0's load fails after the worker started its own: one error, no rank left waiting
  r = run_cli(cat("run -m ", m, " --device cpu -q --prompt-tokens 1,2 -n 2 --tp 2 --ctx-size 1000000"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--ctx-size 1000000 exceeds"), std::string::npos) << r.err;
  r = run_cli("tp-worker -q");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("WORLD_SIZE is not set"), std::string::npos) << r.err;
  r = run_cli("tp-worker -q", "", "WORLD_SIZE=2 RANK=0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("RANK is 0"), std::string::npos) << r.err;
  // a worker whose rank 0 never comes: one error naming the address, within NF4FLASH_TP_TIMEOUT
  r = run_cli("tp-worker -q", "", "WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 NF4FLASH_TP_TIMEOUT=1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("127.0.0.1:9"), std::string::npos) << r.err;
}

// `s` as one single-quoted shell word
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// A worker started by --tp ends with rank 0 however rank 0 ends (here: SIGKILL mid-generation).
TEST(CliTensorParallel, WorkersEndWithRankZero) {
  const std::string script = cat(
      "'", NF4FLASH_BIN, "' run -m ", model_dir("llama-gqa-hd64"), " --device cpu -t 1 -q --prompt-tokens 1,2 -n 4000 ",
      "--ignore-eos --tp 2 >/dev/null 2>&1 & p=$!; w=; for i in $(seq 50); do ",
      "w=$(cat /proc/$p/task/$p/children 2>/dev/null); [ -n \"$w\" ] && break; sleep 0.1; done; sleep 0.5; ",
      "kill -9 $p; wait $p 2>/dev/null; for i in $(seq 50); do kill -0 $w 2>/dev/null || { echo gone $w; exit 0; }; ",
      "sleep 0.1; done; echo alive $w");
  const nf4flash::test::CliResult r = nf4flash::test::run_program("/bin/bash", "-c " + shell_quote(script));
  EXPECT_EQ(r.out.rfind("gone ", 0), 0u) << r.out << r.err;
  EXPECT_GT(r.out.size(), 6u) << "no worker was seen: " << r.out;
}

}  // namespace
