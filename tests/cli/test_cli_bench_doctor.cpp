// CLI behaviour of `nf4flash bench` and `nf4flash doctor` on the tiny fixtures, on the CPU:
// bench writes JSON with every field, a valid SVG with a series per configuration, a table on
// stdout, and error rows for what the CPU cannot serve; doctor warns (exit 1) exactly where a
// pitfall is present and stays quiet (exit 0) otherwise. Kept small: -p 16,32 -n 4. Also the
// command line of nf4flash-kernel-bench.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/device_info.h"
#include "test_util.h"
#include "unit/test_bench_xml.h"

namespace {

namespace fs = std::filesystem;
using nf4flash::test::slurp;

class BenchDoctorCli : public ::testing::Test {
 protected:
  static nf4flash::test::CliResult run(const std::string& args) { return nf4flash::test::run_cli(args); }
  static std::string model(const std::string& name) { return nf4flash::test::model_dir(name); }
  static bool have_gpu() { return !nf4flash::query_gpus().empty(); }
  nf4flash::test::TempDir dir_{"nf4flash_cli_bench"};
};

TEST_F(BenchDoctorCli, BenchHelpDocumentsEveryFlag) {
  const nf4flash::test::CliResult r = run("bench --help");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* f : {"--model", "--preset", "--quant", "--double-quant", "--attn", "--no-cache", "--graphs", "-p,",
                        "-n,", "--ctx", "-r,", "--warmup", "--json", "--svg", "--device", "--compute-dtype", "--ubatch"})
    EXPECT_NE(r.out.find(f), std::string::npos) << f << "\n" << r.out;
}

TEST_F(BenchDoctorCli, BenchFixtureMatrixJsonSvgTable) {
  const fs::path js = dir_.path / "b.json", svg = dir_.path / "b.svg";
  const nf4flash::test::CliResult r = run("bench --model " + model("llama-gqa-hd64") +
                    " --device cpu -t 2 --quant none,nf4 --double-quant --attn eager,flash --no-cache"
                    " -p 16,32 -n 4 --ctx 8,32 -r 2 --json " + js.string() + " --svg " + svg.string());
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("| # | quant | attn | graphs | cache | test | ms | tok/s |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TTFT pp32"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[1/8]"), std::string::npos) << r.err;  // progress on stderr

  const nlohmann::json j = nlohmann::json::parse(slurp(js));
  for (const char* k : {"schema", "date", "command", "argv", "commit", "version", "host", "cuda_build", "gpus", "model",
                        "params", "configs", "peak_vram_bytes", "host_peak_rss_bytes", "total_s"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_NE(j["command"].get<std::string>().find("bench"), std::string::npos);
  EXPECT_FALSE(j["commit"].get<std::string>().empty());
  EXPECT_FALSE(j["host"]["cpu_model"].get<std::string>().empty());
  EXPECT_GT(j["host_peak_rss_bytes"].get<size_t>(), 0u);
  ASSERT_EQ(j["configs"].size(), 8u);  // 2 quant x (2 attn cache on + 2 attn cache off)
  int ok = 0;
  for (const auto& c : j["configs"]) {
    for (const char* k : {"index", "label", "quant", "double_quant", "attn", "graphs", "use_cache", "status", "loaded",
                          "load_ms", "wall_s", "peak_vram_bytes", "host_peak_rss_bytes", "prefill", "decode"})
      EXPECT_TRUE(c.contains(k)) << k;
    if (c["attn"] == "flash") {  // the CPU cannot serve it: an error row with the engine's reason
      EXPECT_EQ(c["status"], "error");
      EXPECT_NE(c["error"].get<std::string>().find("--attn flash"), std::string::npos) << c["error"];
      continue;
    }
    ++ok;
    ASSERT_EQ(c["status"], "ok") << c.dump();
    const auto& rep = c["report"];
    for (const char* k : {"device", "backend", "compute_dtype", "quant", "double_quant", "attn", "linear_decode",
                          "linear_prefill", "use_cache", "graphs", "weight_bytes", "kv_bytes", "ctx_size", "load_ms"})
      EXPECT_TRUE(rep.contains(k)) << k;
    EXPECT_EQ(rep["device"], "cpu");
    EXPECT_EQ(rep["quant"], c["quant"]);
    EXPECT_EQ(rep["double_quant"], c["quant"] == "nf4");
    EXPECT_EQ(rep["use_cache"], c["use_cache"]);
    const bool cache = c["use_cache"].get<bool>();
    ASSERT_EQ(c["prefill"].size(), cache ? 2u : 1u);
    for (const auto& p : c["prefill"]) {
      EXPECT_FALSE(p.contains("error")) << p.dump();
      EXPECT_EQ(p["ttft_ms"]["runs"].size(), 2u);
      EXPECT_GT(p["ttft_ms"]["median"].get<double>(), 0);
      EXPECT_GT(p["tok_s"]["median"].get<double>(), 0);
    }
    ASSERT_EQ(c["decode"].size(), cache ? 2u : 1u);
    for (const auto& d : c["decode"]) {
      EXPECT_FALSE(d.contains("error")) << d.dump();
      EXPECT_EQ(d["tokens"], 3);
      EXPECT_EQ(d["tok_s"]["runs"].size(), 2u);
      EXPECT_GT(d["tok_s"]["min"].get<double>(), 0);
    }
    if (!cache) {
      EXPECT_EQ(c["decode"][0]["ctx"], 16);
    }
  }
  EXPECT_EQ(ok, 4);

  const nf4flash::test::XmlDoc d = nf4flash::test::parse_xml(slurp(svg));
  ASSERT_TRUE(d.ok()) << d.error;
  EXPECT_EQ(d.count("g", "class", "series"), 2 * ok);  // TTFT panel + decode panel
  EXPECT_EQ(d.count("g", "class", "legend-item"), 8);
}

TEST_F(BenchDoctorCli, BenchPresetTiny) {
  const fs::path js = dir_.path / "t.json";
  const nf4flash::test::CliResult r = run("bench --preset tiny --device cpu -t 2 -p 16 -n 4 -r 1 --graphs off --json " + js.string());
  ASSERT_EQ(r.code, 0) << r.err << r.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(js));
  EXPECT_EQ(j["model"]["source"], "preset");
  EXPECT_EQ(j["model"]["name"], "tiny");
  ASSERT_EQ(j["configs"].size(), 1u);
  EXPECT_EQ(j["configs"][0]["status"], "ok") << j["configs"][0].dump();
  EXPECT_EQ(j["configs"][0]["decode"][0]["ctx"], 16);  // default depth: the first prompt length
  EXPECT_EQ(j["params"]["repetitions"], 1);
}

TEST_F(BenchDoctorCli, BenchRefusesBadInput) {
  nf4flash::test::CliResult r = run("bench -p 16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
  r = run("bench --preset tiny --quant q8");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("q8"), std::string::npos) << r.err;
  r = run("bench --preset nosuch -p 16");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("nosuch"), std::string::npos) << r.err;
  r = run("bench --preset tiny -p 16,abc");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("abc"), std::string::npos) << r.err;
  r = run("bench --preset tiny --device cpu --graphs on -p 16 -n 2 -r 1");  // only an unservable configuration
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("--graphs on"), std::string::npos) << r.out;
}

// nf4flash-kernel-bench (bench/kernels/, built with CUDA): its options are documented, and a bad
// command line or a machine without a GPU gives one "error:" line and a non-zero exit, never a crash.
// Runs no kernel: only the command-line checks (and, without a GPU, the device check).
TEST_F(BenchDoctorCli, KernelBenchHelpAndErrors) {
#ifndef NF4FLASH_KERNEL_BENCH
  GTEST_SKIP() << "built without CUDA (NF4FLASH_CUDA off): there is no nf4flash-kernel-bench";
#else
  auto kb = [](const std::string& args) { return nf4flash::test::run_program(NF4FLASH_KERNEL_BENCH, args); };
  nf4flash::test::CliResult r = kb("--help");
  EXPECT_EQ(r.code, 0) << r.err;
  for (const char* f : {"--json", "--attention-only", "--gemv-only", "--decode-forms", "--skinny-forms", "--reps",
                        "--trials", "--device", "--help"})
    EXPECT_NE(r.out.find(f), std::string::npos) << f << "\n" << r.out;
  for (const char* bad : {"--no-such-option", "--reps 0", "--trials abc", "--gemv-only --attention-only",
                          "--skinny-forms --decode-forms", "--skinny-forms --gemv-only"}) {
    r = kb(bad);
    EXPECT_NE(r.code, 0) << bad;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << bad << ": " << r.err;
    EXPECT_EQ(nf4flash::test::count_lines(r.err), 1) << bad << ": " << r.err;
    EXPECT_TRUE(r.out.empty()) << bad << ": " << r.out;
  }
  r = kb("--no-such-option");
  EXPECT_NE(r.err.find("--no-such-option"), std::string::npos) << r.err;
  if (!have_gpu()) {  // no device: one clear line, exit 1
    r = kb("--reps 1 --trials 1");
    EXPECT_EQ(r.code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("no usable CUDA device"), std::string::npos) << r.err;
    EXPECT_EQ(nf4flash::test::count_lines(r.err), 1) << r.err;
  }
#endif
}

TEST_F(BenchDoctorCli, DoctorCleanOnCpuExitsZero) {
  if (have_gpu()) GTEST_SKIP() << "a GPU is present: --device cpu is itself a warning there";
  const nf4flash::test::CliResult r = run("doctor --model " + model("llama-gqa-hd64") + " --device cpu");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("warning:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ok: nothing wrong found"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention  cpu-eager"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("linear     decode: cpu"), std::string::npos) << r.out;  // loaded: exact kernel names
}

// The NF4FLASH_* settings in effect are listed (text and JSON), each set one an info line.
TEST_F(BenchDoctorCli, DoctorListsTheSettingsInEffect) {
  const std::string cmd = "doctor --model " + model("llama-gqa-hd64") + " --device cpu --no-load";
  nf4flash::test::CliResult r = run(cmd);
  EXPECT_NE(r.out.find("defaults (no NF4FLASH_* setting in the environment)"), std::string::npos) << r.out;
  r = nf4flash::test::run_cli(cmd + " --json", "", "NF4FLASH_Q4_GEMM=dequant NF4FLASH_PDL=0");
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out << r.err;
  EXPECT_EQ(j["settings"]["NF4FLASH_Q4_GEMM"], "dequant") << r.out;
  EXPECT_EQ(j["settings"]["NF4FLASH_PDL"], "0") << r.out;
}

TEST_F(BenchDoctorCli, DoctorWarnsOnNoCache) {
  const nf4flash::test::CliResult r = run("doctor --model " + model("llama-gqa-hd64") + " --device cpu --no-cache");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("warning:"), std::string::npos);
  EXPECT_NE(r.out.find("drop --no-cache"), std::string::npos) << r.out;
}

TEST_F(BenchDoctorCli, DoctorWarnsOnFlashOnCpu) {
  const nf4flash::test::CliResult r = run("doctor --model " + model("llama-gqa-hd64") + " --device cpu --attn flash");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("--attn flash is a CUDA kernel"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fix: --attn eager"), std::string::npos) << r.out;
}

TEST_F(BenchDoctorCli, DoctorWarnsOnComputeDtypeMismatch) {
  const nf4flash::test::CliResult r = run("doctor --model " + model("llama-gqa-hd64") + " --device cpu --compute-dtype f16");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("fix: --compute-dtype bf16"), std::string::npos) << r.out;
}

TEST_F(BenchDoctorCli, DoctorJson) {
  const nf4flash::test::CliResult r = run("doctor --model " + model("llama2-tok-hd64") + " --device cpu --no-cache --json");
  EXPECT_EQ(r.code, 1) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* k : {"ok", "warnings", "version", "cuda_build", "host", "gpus", "model", "plan", "memory", "tokenizer",
                        "findings"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_FALSE(j["ok"].get<bool>());
  bool cache_warning = false;
  for (const auto& f : j["findings"])
    if (f["code"] == "cache_disabled" && f["level"] == "warning" && f["fix"] == "drop --no-cache") cache_warning = true;
  EXPECT_TRUE(cache_warning) << j["findings"].dump();
  EXPECT_EQ(j["plan"]["device"], "cpu");
  EXPECT_TRUE(j["plan"]["loaded"].get<bool>());
  EXPECT_FALSE(j["plan"]["use_cache"].get<bool>());
  EXPECT_TRUE(j["tokenizer"]["present"].get<bool>());
  EXPECT_GT(j["memory"]["kv_bytes"].get<size_t>(), 0u);
  EXPECT_TRUE(j["memory"]["fits"].get<bool>());
  // the CPU backend's rates measured now and the speed they predict
  EXPECT_GT(j["placement"]["predicted"]["decode_tok_s"].get<double>(), 0.0);
  EXPECT_GT(j["placement"]["predicted"]["ttft_ms"].get<double>(), 0.0);
  EXPECT_GT(j["placement"]["rates"]["cpu"]["gemv_bytes_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["placement"]["rates"]["host_read_bytes_per_s"].get<double>(), 0.0);
}

TEST_F(BenchDoctorCli, DoctorPlanOnlyForABigPreset) {
  const nf4flash::test::CliResult r = run("doctor --preset llama3-8b --device cpu --no-load --json");
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["plan"]["loaded"].get<bool>());
  EXPECT_FALSE(j.contains("placement"));  // --no-load measures nothing
  // 8.03B parameters as bf16 (the CPU's default compute keeps dense weights bf16)
  EXPECT_GT(j["memory"]["weight_bytes"].get<size_t>(), size_t{15'000'000'000});
  EXPECT_LT(j["memory"]["weight_bytes"].get<size_t>(), size_t{17'000'000'000});
  EXPECT_EQ(j["model"]["head_dim"], 128);
}

// The family presets and the 70B shape at full size, plan only: NF4-dq weights near 0.52 bytes a
// parameter of the quantized linears (every expert of a mixture) plus the bf16 embeddings and heads.
TEST_F(BenchDoctorCli, DoctorPlansTheFamilyPresets) {
  const std::pair<const char*, double> cases[] = {
      {"gemma2-9b", 6.1e9}, {"phi3-mini", 2.27e9}, {"mixtral-8x7b", 24.5e9}, {"qwen3-30b-a3b", 16.7e9},
      {"llama3-70b", 39.5e9}};
  for (const auto& [preset, bytes] : cases) {
    const nf4flash::test::CliResult r =
        run(std::string("doctor --preset ") + preset + " --device cpu --quant nf4 --double-quant --no-load --json");
    ASSERT_TRUE(r.code == 0 || r.code == 1) << preset << ": " << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const double w = j["memory"]["weight_bytes"].get<double>();
    EXPECT_GT(w, 0.85 * bytes) << preset;
    EXPECT_LT(w, 1.15 * bytes) << preset;
  }
}

// --tp N: one rank's share. llama3-70b bf16 over 4 ranks: layers, embedding and head split (~35 GB
// a rank); 8 kv heads over 4 ranks: 2 a rank, a quarter of the KV.
TEST_F(BenchDoctorCli, DoctorPlansOneRanksShareUnderTensorParallel) {
  auto plan = [&](const std::string& extra) {
    const nf4flash::test::CliResult r =
        run("doctor --preset llama3-70b --device cpu --quant none --no-load --json" + extra);
    EXPECT_TRUE(r.code == 0 || r.code == 1) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json one = plan(""), four = plan(" --tp 4");
  EXPECT_EQ(four["memory"]["tp"], 4);
  const double w1 = one["memory"]["weight_bytes"].get<double>(), w4 = four["memory"]["weight_bytes"].get<double>();
  EXPECT_NEAR(w4, w1 / 4, 0.01 * w4);
  EXPECT_EQ(four["memory"]["kv_bytes_per_token"].get<double>() * 4, one["memory"]["kv_bytes_per_token"].get<double>());
  bool said = false;
  for (const auto& f : four["findings"]) said = said || f["code"] == "tensor_parallel";
  EXPECT_TRUE(said) << four["findings"].dump();
}

TEST_F(BenchDoctorCli, DoctorWithoutModelShowsHardware) {
  const nf4flash::test::CliResult r = run("doctor");
  EXPECT_EQ(r.code, have_gpu() ? r.code : 0) << r.out << r.err;
  EXPECT_NE(r.out.find("GPUs"), std::string::npos);
  EXPECT_NE(r.out.find("host"), std::string::npos);
}

}  // namespace
