// Bench reports: the JSON carries every field and raw repetition, the Markdown table has a row per
// measurement and the error rows, the SVG is well-formed XML with one series per configuration
// that ran (and every configuration in the legend); host/GPU queries never throw. Over several
// --gpu-layers values: the GPU layers column, the offload cliff table, the placement in the JSON
// and the cliff chart (one line per quant in each of its panels); without them, none of these.
#include <gtest/gtest.h>

#include <map>

#include "backend/device_info.h"
#include "bench/bench_cliff.h"
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

// A bf16 model of 32 layers (15 GiB, 12 GiB of it in the layers) and its NF4 version (5 GiB, 4 GiB
// in the layers) at gpu_layers 32, 16 and 0; none at 0 fails to load, nf4 at 16 fails its decode.
BenchResult cliff_result() {
  BenchResult r;
  r.spec.preset = "llama3-8b";
  r.spec.quants = {QuantChoice::None, QuantChoice::NF4};
  r.spec.double_quant = true;
  r.spec.gpu_layers = {32, 16, 0};
  r.spec.attns = {AttnChoice::Sdpa};
  r.spec.prompts = {512};
  r.spec.ctxs = {512};
  r.spec.n_gen = 32;
  r.spec.reps = 1;
  struct Want {
    double decode, ttft;  // < 0: the cell fails
  };
  const std::map<std::pair<int, int>, Want> want = {
      {{0, 32}, {400, 35}}, {{0, 16}, {12.5, 900}}, {{1, 32}, {180, 60}}, {{1, 16}, {-1, 1500}}, {{1, 0}, {4.2, 9000}}};
  int k = 0;
  for (int qi = 0; qi < 2; ++qi)
    for (int g : r.spec.gpu_layers) {
      const QuantChoice q = r.spec.quants[qi];
      ConfigResult c;
      c.config = {++k, q, qi == 1, AttnChoice::Sdpa, -1, true, g, true};
      const auto it = want.find({qi, g});
      if (it == want.end()) {
        c.error = "out of host memory while loading";
        r.configs.push_back(c);
        continue;
      }
      c.has_report = true;
      c.loaded = true;
      EngineReport& e = c.report;
      e.device = g == 0 ? "cpu" : "cuda";
      e.quant = qi ? "nf4" : "none";
      e.n_layers = 32;
      e.gpu_layers = g;
      const size_t gib = size_t{1} << 30;
      e.weight_bytes = qi ? 5 * gib : 15 * gib;
      e.kv_bytes = 64u << 20;
      if (g > 0 && g < 32) {
        e.offload_device = "cpu";
        e.offloaded_bytes = (qi ? 4 * gib : 12 * gib) * (32 - g) / 32;
        e.kv_offloaded_bytes = 32u << 20;
      }
      PrefillCell pc;
      pc.prompt = 512;
      pc.ttft_ms = make_stat({it->second.ttft});
      pc.tok_s = make_stat({512000 / it->second.ttft});
      c.prefill.push_back(pc);
      DecodeCell dc;
      dc.ctx = 512;
      dc.tokens = 31;
      if (it->second.decode < 0) {
        dc.error = "out of host memory";
      } else {
        dc.tok_s = make_stat({it->second.decode});
        dc.ms = make_stat({31000 / it->second.decode});
      }
      c.decode.push_back(dc);
      r.configs.push_back(c);
    }
  return r;
}

TEST(BenchCliff, MarkdownTable) {
  const BenchResult r = cliff_result();
  const std::string md = bench_markdown(r, nullptr);
  const std::string table =
      "| GPU layers | none: % offloaded | none: decode tok/s | none: TTFT ms | nf4 dq: % offloaded | nf4 dq: decode "
      "tok/s | nf4 dq: TTFT ms |\n"
      "|---|--:|--:|--:|--:|--:|--:|\n"
      "| 32/32 | 0.0 | 400 | 35.0 | 0.0 | 180 | 60.0 |\n"
      "| 16/32 | 40.0 | 12.5 | 900 | 40.0 | error | 1500 |\n"
      "| 0/32 | error | error | error | 100.0 | 4.20 | 9000 |\n";
  EXPECT_NE(md.find(table), std::string::npos) << md;
  EXPECT_NE(md.find("Offload cliff: decode tok/s (tg31 @ d512) and TTFT ms (pp512)"), std::string::npos) << md;
  // the main table's GPU layers column: placed layers from the report, the request on an error row
  EXPECT_NE(md.find("| # | quant | GPU layers | attn | graphs | cache | test | ms | tok/s |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 2 | none | 16/32 | sdpa | auto | on | decode tg31 @ d512 | 2480 | 12.5 |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| 3 | none | 0 | sdpa | auto | on | error | - | - |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 3 | none \\| ngl 0 \\| sdpa \\| graphs auto \\| cache on | out of host memory while loading |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| offloaded to CPU |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 6.00 GiB + KV 32.0 MiB |"), std::string::npos) << md;  // none at 16 of 32 layers
  // the table follows the main table, before the paths
  EXPECT_LT(md.find("| 6 | nf4 dq |"), md.find("Offload cliff"));
  EXPECT_LT(md.find("Offload cliff"), md.find("| # | device |"));
}

TEST(BenchCliff, CellsAndRowLabels) {
  BenchResult r = cliff_result();
  r.spec.gpu_layers = {32, 16, 0, kAutoLayers};
  ConfigResult a = r.configs[3];  // nf4 at 32 layers, asked as auto
  a.config.index = 7;
  a.config.gpu_layers = kAutoLayers;
  r.configs.push_back(a);
  const BenchCliff cl = bench_cliff(r);
  ASSERT_EQ(cl.cells.size(), 4u);
  ASSERT_EQ(cl.quants.size(), 2u);
  EXPECT_EQ(cl.quants[1].name, "nf4 dq");
  EXPECT_EQ(cl.prompt, 512);
  EXPECT_EQ(cl.depth, 512);
  EXPECT_EQ(cl.row_label(0), "32/32");
  EXPECT_EQ(cl.row_label(3), "auto (32/32)");
  EXPECT_EQ(cl.cells[3][0].config, nullptr);  // no none configuration with auto
  ASSERT_NE(cl.cells[3][1].config, nullptr);
  EXPECT_EQ(cl.cells[3][1].config->config.index, 7);
  EXPECT_DOUBLE_EQ(cl.cells[1][0].offloaded, 0.4);
  EXPECT_DOUBLE_EQ(cl.cells[2][1].offloaded, 1.0);  // gpu_layers 0: the whole model on the CPU backend
  EXPECT_NE(bench_markdown(r).find("| auto (32/32) | error | error | error | 0.0 | 180 | 60.0 |"), std::string::npos);
}

TEST(BenchCliff, JsonPlacement) {
  const nlohmann::json j = bench_to_json(cliff_result(), sample_meta());
  EXPECT_EQ(j["params"]["gpu_layers"], nlohmann::json::array({"32", "16", "0"}));
  EXPECT_EQ(j["params"]["max_vram"], 0);
  const auto& c = j["configs"][1];
  EXPECT_EQ(c["gpu_layers"], "16");
  EXPECT_EQ(c["label"], "none | ngl 16 | sdpa | graphs auto | cache on");
  EXPECT_EQ(c["report"]["n_layers"], 32);
  EXPECT_EQ(c["report"]["gpu_layers"], 16);
  EXPECT_EQ(c["report"]["offload_device"], "cpu");
  EXPECT_EQ(c["report"]["offloaded_bytes"], size_t{6} << 30);
  EXPECT_EQ(c["report"]["kv_offloaded_bytes"], 32u << 20);
  EXPECT_DOUBLE_EQ(c["weights_offloaded_fraction"].get<double>(), 0.4);
  EXPECT_EQ(j["configs"][2]["gpu_layers"], "0");
  EXPECT_EQ(j["configs"][2]["status"], "error");
  EXPECT_FALSE(j["configs"][2].contains("weights_offloaded_fraction"));
  EXPECT_DOUBLE_EQ(j["configs"][5]["weights_offloaded_fraction"].get<double>(), 1.0);
  EXPECT_EQ(j["configs"][5]["report"]["offload_device"], "");
}

// The cliff-series groups inside the i-th <g class="panel"> and the polylines and markers in each.
struct PanelSeries {
  std::string quant;
  int polylines = 0, circles = 0;
};
std::vector<PanelSeries> cliff_series_in_panel(const test::XmlDoc& d, int panel) {
  std::vector<PanelSeries> out;
  int seen = -1;
  for (size_t i = 0; i < d.elements.size(); ++i) {
    const test::XmlElement& p = d.elements[i];
    if (p.name != "g" || !p.attrs.count("class") || p.attrs.at("class") != "panel" || ++seen != panel) continue;
    for (size_t j = i + 1; j < d.elements.size() && d.elements[j].depth > p.depth; ++j) {
      const test::XmlElement& g = d.elements[j];
      if (g.name == "g" && g.attrs.count("class") && g.attrs.at("class") == "cliff-series") {
        out.push_back({g.attrs.at("data-quant")});
      } else if (!out.empty() && g.depth > p.depth + 1) {
        out.back().polylines += g.name == "polyline";
        out.back().circles += g.name == "circle";
      }
    }
  }
  return out;
}

TEST(BenchCliff, SvgChart) {
  const std::string svg = bench_svg(cliff_result(), "cliff <llama3-8b>");
  const test::XmlDoc d = test::parse_xml(svg);
  ASSERT_TRUE(d.ok()) << d.error << "\n" << svg;
  EXPECT_EQ(d.count("g", "class", "panel"), 4);  // TTFT, decode, and the cliff's decode and TTFT
  EXPECT_EQ(d.count("g", "class", "cliff"), 1);
  EXPECT_EQ(d.count("g", "class", "cliff-series"), 4);
  EXPECT_EQ(d.count("g", "class", "cliff-legend-item"), 2);
  EXPECT_EQ(d.count("g", "class", "series"), 5 + 4);  // TTFT and decode of the configurations that ran, as before
  // panels 2 and 3: decode tok/s and TTFT against % offloaded, one line with markers per quant
  const std::vector<PanelSeries> dec = cliff_series_in_panel(d, 2), ttft = cliff_series_in_panel(d, 3);
  ASSERT_EQ(dec.size(), 2u);
  ASSERT_EQ(ttft.size(), 2u);
  EXPECT_EQ(dec[0].quant, "none");
  EXPECT_EQ(dec[1].quant, "nf4 dq");
  for (const PanelSeries& s : {dec[0], dec[1], ttft[0], ttft[1]}) EXPECT_EQ(s.polylines, 1) << s.quant;
  EXPECT_EQ(dec[0].circles, 2);   // 32 and 16 layers (none at 0 did not load)
  EXPECT_EQ(dec[1].circles, 2);   // 32 and 0 layers (the decode at 16 failed)
  EXPECT_EQ(ttft[1].circles, 3);
  // 4.2 .. 400 tok/s and 35 .. 9000 ms span more than 20x: log y axes in both cliff panels
  size_t logs = 0;
  for (size_t p = svg.find("(log scale)"); p != std::string::npos; p = svg.find("(log scale)", p + 1)) ++logs;
  EXPECT_EQ(logs, 2u) << svg;
  EXPECT_NE(svg.find(">100%</text>"), std::string::npos);
}

TEST(BenchCliff, OneOffloadedValueHasTheTableButNoChart) {
  BenchResult r = cliff_result();
  r.spec.gpu_layers = {16};
  r.configs = {r.configs[1], r.configs[4]};
  const std::string md = bench_markdown(r);
  EXPECT_NE(md.find("| 16/32 | 40.0 | 12.5 | 900 | 40.0 | error | 1500 |"), std::string::npos) << md;
  const test::XmlDoc d = test::parse_xml(bench_svg(r, "one value"));
  ASSERT_TRUE(d.ok()) << d.error;
  EXPECT_EQ(d.count("g", "class", "cliff"), 0);
  EXPECT_EQ(d.count("g", "class", "panel"), 2);
}

TEST(BenchCliff, WithoutGpuLayersTheOutputIsUnchanged) {
  const BenchResult r = sample_result();
  EXPECT_FALSE(bench_shows_offload(r));
  EXPECT_EQ(bench_cliff_markdown(r), "");
  const std::string md = bench_markdown(r);
  for (const char* s : {"GPU layers", "Offload cliff", "offloaded to CPU", "ngl"})
    EXPECT_EQ(md.find(s), std::string::npos) << s << "\n" << md;
  const std::string svg = bench_svg(r, "t");
  EXPECT_EQ(svg.find("cliff"), std::string::npos);
  EXPECT_EQ(svg.find("ngl"), std::string::npos);
  const nlohmann::json j = bench_to_json(r, sample_meta());
  EXPECT_EQ(j["configs"][0]["gpu_layers"], "all");
  EXPECT_EQ(j["configs"][0]["label"], "none | sdpa | graphs auto | cache on");
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
