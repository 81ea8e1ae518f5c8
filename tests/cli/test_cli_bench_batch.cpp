// `nf4flash bench --batch` on the CPU (tiny preset and a fixture model): a cell per batch size with
// every request's tokens generated, KV blocks within the pool, decode steps with every row decoding,
// the JSON, Markdown and SVG outputs; bad lists and matrix flags are one clear error.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "unit/test_bench_xml.h"

namespace {

namespace fs = std::filesystem;
using nf4flash::test::CliResult;
using nf4flash::test::run_cli;
using nf4flash::test::slurp;

TEST(BenchBatchCli, CellsPerBatchSizeWithJsonMarkdownSvg) {
  nf4flash::test::TempDir dir("nf4flash_cli_bench_batch");
  const fs::path js = dir.path / "b.json", md = dir.path / "b.md", svg = dir.path / "b.svg";
  const CliResult r = run_cli("bench --model " + nf4flash::test::model_dir("llama-gqa-hd64") +
                              " --device cpu -t 2 --quant nf4 --batch 1,3,5 -p 20 -n 6 --json " + js.string() +
                              " --markdown " + md.string() + " --svg " + svg.string());
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(js));
  EXPECT_EQ(j["schema"], "nf4flash-bench-batch/1");
  EXPECT_EQ(j["report"]["quant"], "nf4");
  ASSERT_EQ(j["cells"].size(), 3u);
  const int sizes[] = {1, 3, 5};
  for (int i = 0; i < 3; ++i) {
    const nlohmann::json& c = j["cells"][size_t(i)];
    SCOPED_TRACE(c.dump());
    EXPECT_EQ(c["status"], "ok");
    EXPECT_EQ(c["batch"], sizes[i]);
    EXPECT_EQ(c["generated"], 6 * sizes[i]);  // every request ran to -n
    EXPECT_GT(c["agg_decode_tok_s"].get<double>(), 0);
    EXPECT_GT(c["per_seq_decode_tok_s"].get<double>(), 0);
    EXPECT_GT(c["ttft_ms_median"].get<double>(), 0);
    EXPECT_GE(c["ttft_ms_max"].get<double>(), c["ttft_ms_median"].get<double>());
    EXPECT_GE(c["decode_steps"].get<int>(), 4);  // the last tokens come from steps where all rows decode
    EXPECT_GT(c["kv_blocks_peak"].get<int>(), 0);
    EXPECT_LE(c["kv_blocks_peak"].get<int>(), c["kv_blocks_total"].get<int>());
    // 26 positions a request: 2 blocks of 16 each, all requests at once
    EXPECT_EQ(c["kv_blocks_peak"].get<int>(), 2 * sizes[i]);
  }
  EXPECT_NE(r.out.find("| batch | aggregate decode tok/s"), std::string::npos) << r.out;
  EXPECT_EQ(slurp(md), r.out);
  const nf4flash::test::XmlDoc d = nf4flash::test::parse_xml(slurp(svg));
  ASSERT_TRUE(d.ok()) << d.error;
  EXPECT_EQ(d.count("rect", "class", "bar"), 6);  // two panels, a bar per batch size
}

TEST(BenchBatchCli, BadListsAndMatrixFlagsAreOneError) {
  const std::string base = "bench --preset tiny --device cpu -t 2 -n 2 ";
  for (const char* bad : {"-p 8 --batch 0", "-p 8 --batch 2,x", "-p 8 --batch 5000", "-p 8 --batch 2 --quant none,nf4",
                          "--batch 2 -p 8,16", "-p 8 --batch 2 --no-cache", "-p 8 --batch 2 --graphs on,off",
                          "-p 8 --batch 2 --graphs on"}) {  // the CPU backend has no step graphs
    const CliResult r = run_cli(base + bad);
    EXPECT_NE(r.code, 0) << bad;
    EXPECT_NE(r.err.find("error"), std::string::npos) << bad << ": " << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << bad << ": " << r.err;
  }
}

}  // namespace
