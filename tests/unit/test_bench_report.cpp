// Bench reports: the JSON carries every field and raw repetition, the Markdown table has a row per
// measurement and the error rows, the SVG is well-formed XML with one series per configuration
// that ran (and every configuration in the legend); host/GPU queries never throw.
#include <gtest/gtest.h>

#include "backend/device_info.h"
#include "bench/bench_report.h"
#include "bench/bench_svg.h"
#include "unit/test_bench_xml.h"

namespace nf4flash {
namespace {

BenchResult sample_result() {
  BenchResult r;
  r.spec.preset = "tiny";
  r.spec.quants = {QuantChoice::None, QuantChoice::NF4};
  r.spec.double_quant = true;
  r.spec.attns = {AttnChoice::Sdpa, AttnChoice::Flash};
  r.spec.prompts = {512, 4096};
  r.spec.ctxs = {512, 32768};
  r.spec.n_gen = 128;
  r.spec.reps = 3;
  r.spec.no_cache = true;
  int k = 0;
  auto add = [&](QuantChoice q, AttnChoice a, bool cache, const std::string& err) {
    ConfigResult c;
    c.config = {++k, q, q != QuantChoice::None, a, cache ? -1 : 0, cache};
    c.error = err;
    if (err.empty()) {
      c.has_report = true;
      c.report.device = "cuda";
      c.report.attn = a == AttnChoice::Sdpa ? "sdpa" : "flash";
      c.report.linear_decode = "gemv_nf4 <fused>";  // needs escaping in SVG/XML only
      c.report.linear_prefill = "dequant|cublasLt";  // '|' needs escaping in Markdown
      c.report.weight_bytes = size_t{5} << 30;
      c.report.kv_bytes = size_t{4} << 30;
      c.loaded = k == 1;
      c.peak_vram_bytes = size_t{10} << 30;
      c.host_peak_rss_bytes = size_t{1} << 30;
      const std::vector<int64_t> prompts = cache ? std::vector<int64_t>{512, 4096} : std::vector<int64_t>{512};
      for (int64_t p : prompts) {
        PrefillCell pc;
        pc.prompt = p;
        pc.ttft_ms = make_stat({p / 40.0, p / 41.0, p / 39.0});
        pc.tok_s = make_stat({40000.0, 41000.0, 39000.0});
        c.prefill.push_back(pc);
      }
      const std::vector<int64_t> depths = cache ? std::vector<int64_t>{512, 32768} : std::vector<int64_t>{512};
      for (int64_t d : depths) {
        DecodeCell dc;
        dc.ctx = d;
        dc.tokens = 127;
        dc.ms = make_stat({150, 151, 149});
        dc.tok_s = make_stat({cache ? 850.0 - d / 100.0 : 20.0, 840, 860});
        c.decode.push_back(dc);
      }
    }
    r.configs.push_back(c);
  };
  add(QuantChoice::None, AttnChoice::Sdpa, true, "");
  add(QuantChoice::None, AttnChoice::Flash, true, "--attn flash: the FlashAttention-2 kernel <not built>");
  add(QuantChoice::None, AttnChoice::Sdpa, false, "");
  add(QuantChoice::NF4, AttnChoice::Sdpa, true, "");
  add(QuantChoice::NF4, AttnChoice::Sdpa, false, "");
  r.peak_vram_bytes = size_t{10} << 30;
  r.host_peak_rss_bytes = size_t{1} << 30;
  r.total_s = 42;
  return r;
}

BenchMeta sample_meta() {
  BenchMeta m;
  m.date = "2026-12-02T15:00:00Z";
  m.command = "nf4flash bench --preset tiny";
  m.argv = {"nf4flash", "bench", "--preset", "tiny"};
  m.commit = "abc1234";
  m.version = "0.1.0";
  m.host.cpu_model = "Test CPU";
  GpuInfo g;
  g.name = "NVIDIA H200";
  g.cc_major = 9;
  g.runtime_version = "12.6";
  m.gpus.push_back(g);
  return m;
}

TEST(BenchJson, EveryField) {
  const nlohmann::json j = bench_to_json(sample_result(), sample_meta());
  for (const char* k : {"schema", "date", "command", "argv", "commit", "commit_dirty", "version", "host", "cuda_build",
                        "gpus", "model", "params", "configs", "peak_vram_bytes", "host_peak_rss_bytes", "total_s"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["gpus"][0]["name"], "NVIDIA H200");
  EXPECT_EQ(j["gpus"][0]["cc"], "9.0");
  for (const char* k : {"quant", "double_quant", "attn", "graphs", "no_cache", "prompts", "n_gen", "decode_tokens", "ctx",
                        "repetitions", "warmup", "device", "compute", "threads", "ubatch", "ctx_size"})
    EXPECT_TRUE(j["params"].contains(k)) << k;
  EXPECT_EQ(j["params"]["decode_tokens"], 127);
  ASSERT_EQ(j["configs"].size(), 5u);
  const auto& c0 = j["configs"][0];
  EXPECT_EQ(c0["status"], "ok");
  EXPECT_EQ(c0["report"]["attn"], "sdpa");
  EXPECT_EQ(c0["prefill"][1]["prompt"], 4096);
  EXPECT_EQ(c0["prefill"][1]["ttft_ms"]["runs"].size(), 3u);
  for (const char* k : {"median", "min", "max", "runs"}) EXPECT_TRUE(c0["decode"][1]["tok_s"].contains(k)) << k;
  EXPECT_EQ(c0["decode"][1]["ctx"], 32768);
  EXPECT_EQ(j["configs"][1]["status"], "error");
  EXPECT_FALSE(j["configs"][1].contains("report"));
  EXPECT_NE(j["configs"][1]["error"].get<std::string>().find("--attn flash"), std::string::npos);
  EXPECT_EQ(j["configs"][3]["double_quant"], true);
  EXPECT_EQ(j["configs"][4]["use_cache"], false);
}

TEST(BenchMarkdown, RowsPathsAndErrors) {
  const std::string md = bench_markdown(sample_result(), nullptr);
  EXPECT_NE(md.find("| # | quant | attn | graphs | cache | test | ms | tok/s |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1 | none | sdpa | auto | on | TTFT pp4096 |"), std::string::npos) << md;
  EXPECT_NE(md.find("decode tg127 @ d32768"), std::string::npos) << md;
  EXPECT_NE(md.find("| 5 | nf4 dq | sdpa | off | off | decode tg127 @ d512 |"), std::string::npos) << md;
  EXPECT_NE(md.find("dequant\\|cublasLt"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2 | none \\| flash \\| graphs auto \\| cache on | --attn flash"), std::string::npos) << md;
  const BenchMeta meta = sample_meta();
  const std::string with_meta = bench_markdown(sample_result(), &meta);
  EXPECT_NE(with_meta.find("NVIDIA H200 (sm_90"), std::string::npos);
  EXPECT_NE(with_meta.find("commit abc1234"), std::string::npos);
}

TEST(BenchSvg, WellFormedWithASeriesPerConfiguration) {
  const BenchResult r = sample_result();
  const std::string svg = bench_svg(r, "bench <tiny> & \"friends\"");
  const test::XmlDoc d = test::parse_xml(svg);
  ASSERT_TRUE(d.ok()) << d.error << "\n" << svg;
  ASSERT_FALSE(d.elements.empty());
  EXPECT_EQ(d.elements[0].name, "svg");
  EXPECT_EQ(d.elements[0].attrs.at("xmlns"), "http://www.w3.org/2000/svg");
  EXPECT_EQ(d.count("g", "class", "panel"), 2);
  // 4 configurations ran: a series in each panel; the error row has none but is in the legend
  EXPECT_EQ(d.count("g", "class", "series"), 2 * 4);
  for (int k : {1, 3, 4, 5}) EXPECT_EQ(d.count("g", "data-config", std::to_string(k)), 3) << k;  // 2 series + legend
  EXPECT_EQ(d.count("g", "data-config", "2"), 1);
  EXPECT_EQ(d.count("g", "class", "legend-item"), 5);
  EXPECT_GE(d.count("polyline"), 4);  // the cache-on series have 2 points each, in each panel
  EXPECT_NE(svg.find("(log scale)"), std::string::npos);  // 512..32768
  EXPECT_NE(svg.find("(error)"), std::string::npos);
}

TEST(BenchSvg, EmptyRunIsStillValid) {
  BenchResult r;
  r.spec.n_gen = 4;
  const test::XmlDoc d = test::parse_xml(bench_svg(r, "nothing"));
  ASSERT_TRUE(d.ok()) << d.error;
  EXPECT_EQ(d.count("g", "class", "series"), 0);
}

TEST(BenchXmlChecker, RejectsBrokenDocuments) {
  EXPECT_FALSE(test::parse_xml("<a><b></a>").ok());
  EXPECT_FALSE(test::parse_xml("<a x=1/>").ok());
  EXPECT_FALSE(test::parse_xml("<a>&nbsp;</a>").ok());
  EXPECT_FALSE(test::parse_xml("<a/><b/>").ok());
  EXPECT_FALSE(test::parse_xml("<a x=\"1\" x=\"2\"/>").ok());
  EXPECT_TRUE(test::parse_xml("<?xml version=\"1.0\"?>\n<a x='1'><!-- c --><b/>t &amp; &#10;</a>\n").ok());
  EXPECT_EQ(xml_escape("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
}

TEST(BenchFormat, Helpers) {
  EXPECT_EQ(format_bytes(size_t{3} << 30), "3.00 GiB");
  EXPECT_EQ(format_bytes(size_t{5} << 20), "5.0 MiB");
  EXPECT_EQ(format_num(12345.6), "12346");
  EXPECT_EQ(format_num(12.345), "12.3");
  EXPECT_EQ(format_num(1.2345), "1.23");
  EXPECT_EQ(shell_quote("-p"), "-p");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
}

TEST(DeviceInfo, QueriesNeverThrow) {
  const HostInfo h = query_host();
  EXPECT_FALSE(h.cpu_model.empty());
  EXPECT_GT(h.logical_cores, 0);
  EXPECT_GT(h.mem_total_bytes, 0u);
  EXPECT_GT(host_rss_bytes(), 0u);
  EXPECT_GE(host_peak_rss_bytes(), host_rss_bytes() / 2);
  const auto gpus = query_gpus();
  if (gpus.empty()) {
    EXPECT_FALSE(gpu_absent_reason().empty());
    size_t f = 0, t = 0;
    EXPECT_FALSE(gpu_memory(0, &f, &t));
  } else {
    EXPECT_GT(gpus[0].total_bytes, 0u);
    EXPECT_GE(gpus[0].cc_major, 3);
  }
}

}  // namespace
}  // namespace nf4flash
