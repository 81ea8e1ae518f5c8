// CLI behaviour of `nf4flash bench --gpu-layers` on the CPU: the flag takes a comma list (a bad or
// repeated entry is refused naming the flag and the entry), --help documents it with the cliff
// example, and a list over the tiny preset runs one configuration per value with the placement in
// the JSON, the offload cliff table on stdout and the cliff chart in the SVG. On --device cpu,
// gpu_layers 0 runs (the whole model on the CPU backend) and a layer count is an error row.
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

TEST(BenchOffloadCli, HelpDocumentsGpuLayers) {
  const CliResult r = run_cli("bench --help");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* s : {"--gpu-layers", "--max-vram", "offload cliff",
                        "--quant none,nf4 --double-quant --gpu-layers 32,28,24,16,8,0"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
}

TEST(BenchOffloadCli, RefusesBadEntries) {
  CliResult r = run_cli("bench --preset tiny --gpu-layers 2,x -p 16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--gpu-layers 'x'"), std::string::npos) << r.err;
  r = run_cli("bench --preset tiny --gpu-layers 2,-3 -p 16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("'-3'"), std::string::npos) << r.err;
  r = run_cli("bench --preset tiny --gpu-layers 2,all,2 -p 16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--gpu-layers: '2' is given twice"), std::string::npos) << r.err;
  r = run_cli("bench --preset tiny --gpu-layers , -p 16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--gpu-layers: no values given"), std::string::npos) << r.err;
}

TEST(BenchOffloadCli, CliffOnTheCpu) {
  nf4flash::test::TempDir dir{"nf4flash_cli_bench_offload"};
  const fs::path js = dir.path / "c.json", svg = dir.path / "c.svg";
  const CliResult r = run_cli("bench --preset tiny --device cpu -t 2 --quant none,nf4 --gpu-layers all,0,1 --graphs off"
                              " -p 16 -n 3 -r 1 --warmup 0 --json " + js.string() + " --svg " + svg.string());
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("| # | quant | GPU layers | attn | graphs | cache | test | ms | tok/s |"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| GPU layers | none: % offloaded | none: decode tok/s | none: TTFT ms | nf4: % offloaded |"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("| 1 | error | error | error | error | error | error |"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("none | ngl 0 | auto | graphs off | cache on"), std::string::npos) << r.err;

  const nlohmann::json j = nlohmann::json::parse(slurp(js));
  EXPECT_EQ(j["params"]["gpu_layers"], nlohmann::json::array({"all", "0", "1"}));
  ASSERT_EQ(j["configs"].size(), 6u);  // quant x gpu_layers
  for (const auto& c : j["configs"]) {
    const std::string g = c["gpu_layers"];
    if (g == "1") {  // a layer on a GPU: the CPU backend cannot place it
      EXPECT_EQ(c["status"], "error");
      EXPECT_NE(c["error"].get<std::string>().find("--gpu-layers"), std::string::npos) << c["error"];
      continue;
    }
    ASSERT_EQ(c["status"], "ok") << c.dump();
    EXPECT_TRUE(c["loaded"].get<bool>());
    const auto& rep = c["report"];
    for (const char* k : {"n_layers", "gpu_layers", "offload_device", "offloaded_bytes", "kv_offloaded_bytes"})
      EXPECT_TRUE(rep.contains(k)) << k;
    EXPECT_EQ(rep["n_layers"], 3);
    EXPECT_EQ(rep["gpu_layers"], 0);
    EXPECT_DOUBLE_EQ(c["weights_offloaded_fraction"].get<double>(), g == "0" ? 1.0 : 0.0);
    EXPECT_GT(c["decode"][0]["tok_s"]["median"].get<double>(), 0);
  }

  const nf4flash::test::XmlDoc d = nf4flash::test::parse_xml(slurp(svg));
  ASSERT_TRUE(d.ok()) << d.error;
  EXPECT_EQ(d.count("g", "class", "panel"), 4);
  EXPECT_EQ(d.count("g", "class", "cliff-series"), 4);  // none and nf4 in each cliff panel
  EXPECT_EQ(d.count("g", "data-quant", "nf4"), 3);       // 2 series + the legend
}

}  // namespace
