// Bench matrix runner against a fake engine: configuration order, one load per quant and
// --gpu-layers value (with that LoadOptions::gpu_layers), error rows with the backend's reason or
// the failed load's, warm-up + repetitions, first token excluded from decode, context fill before
// decode, cache-off measured at the first prompt length only, statistics.
#include <gtest/gtest.h>

#include <map>

#include "bench/bench_runner.h"
#include "core/error.h"

namespace nf4flash {
namespace {

struct Calls {
  int loads = 0;
  std::vector<LoadOptions> load_opts;
  std::vector<std::string> log;  // "prefill n@pos0", "decode n@pos0", "nocache p+n", "configure ..."
};

class FakeEngine : public BenchEngine {
 public:
  FakeEngine(Calls& c, const LoadOptions& o) : c_(c), o_(o) {
    r_.device = "cpu";
    r_.quant = o.quant == QuantChoice::NF4 ? "nf4" : "none";
    r_.double_quant = o.double_quant;
    r_.ctx_size = o.ctx_size;
    r_.load_ms = 5;
    // a 4-layer model of 100 bytes a layer: layers past gpu_layers on the CPU backend
    r_.n_layers = 4;
    r_.gpu_layers = o.gpu_layers < 0 ? 4 : o.gpu_layers;
    r_.weight_bytes = 400;
    if (r_.gpu_layers > 0 && r_.gpu_layers < 4) {
      r_.offload_device = "cpu";
      r_.offloaded_bytes = 100 * (4 - r_.gpu_layers);
    }
  }
  EngineReport report() const override { return r_; }
  int64_t ctx_size() const override { return o_.ctx_size; }
  std::string configure(AttnChoice attn, int graphs, bool use_cache) override {
    c_.log.push_back("configure");
    if (attn == AttnChoice::Flash) return "--attn flash is a CUDA kernel; the CPU backend runs eager attention";
    if (graphs == 1) return "--graphs on: no graphs on cpu";
    r_.attn = attn == AttnChoice::Sdpa ? "sdpa" : "cpu-eager";
    r_.use_cache = use_cache;
    return "";
  }
  double prefill_ms(int64_t n, int64_t pos0) override {
    NF4FLASH_CHECK(n + pos0 <= o_.ctx_size, "context of ", n + pos0, " tokens exceeds the context size ", o_.ctx_size);
    c_.log.push_back("prefill " + std::to_string(n) + "@" + std::to_string(pos0));
    return 0.5 * n + (++k_ % 3);  // varies across repetitions
  }
  double decode_ms(int64_t n, int64_t pos0) override {
    NF4FLASH_CHECK(n + pos0 <= o_.ctx_size, "bench: context ", n + pos0, " exceeds the context size ", o_.ctx_size);
    c_.log.push_back("decode " + std::to_string(n) + "@" + std::to_string(pos0));
    return 2.0 * n;
  }
  double decode_nocache_ms(int64_t prompt, int64_t n) override {
    c_.log.push_back("nocache " + std::to_string(prompt) + "+" + std::to_string(n));
    return 10.0 * n;
  }

 private:
  Calls& c_;
  LoadOptions o_;
  EngineReport r_;
  int k_ = 0;
};

BenchLoader fake_loader(Calls& c) {
  return [&c](const LoadOptions& o, const ProgressFn&) -> std::unique_ptr<BenchEngine> {
    ++c.loads;
    c.load_opts.push_back(o);
    if (o.quant == QuantChoice::FP4) fail("--quant fp4: refused by the fake");
    if (o.gpu_layers == kAutoLayers && o.max_vram < 100) fail("--max-vram ", o.max_vram, " bytes: not even one layer fits");
    return std::make_unique<FakeEngine>(c, o);
  };
}

BenchSpec small_spec() {
  BenchSpec s;
  s.preset = "tiny";
  s.quants = {QuantChoice::None, QuantChoice::NF4};
  s.double_quant = true;
  s.attns = {AttnChoice::Eager, AttnChoice::Flash};
  s.graphs = {-1};
  s.no_cache = true;
  s.prompts = {16, 32};
  s.n_gen = 4;
  s.ctxs = {8, 64};
  s.reps = 3;
  s.warmup = 1;
  s.model_max_positions = 4096;
  return s;
}

TEST(BenchStat, MedianMinMax) {
  BenchStat a = make_stat({3, 1, 2});
  EXPECT_DOUBLE_EQ(a.median, 2);
  EXPECT_DOUBLE_EQ(a.min, 1);
  EXPECT_DOUBLE_EQ(a.max, 3);
  EXPECT_EQ(a.runs, (std::vector<double>{3, 1, 2}));  // raw order kept
  BenchStat b = make_stat({4, 1, 3, 2});
  EXPECT_DOUBLE_EQ(b.median, 2.5);
  EXPECT_TRUE(make_stat({}).runs.empty());
}

TEST(BenchConfigs, MatrixOrderAndCacheOff) {
  BenchSpec s = small_spec();
  s.graphs = {1, 0};
  const auto c = bench_configs(s);
  ASSERT_EQ(c.size(), 2u * (2 * 2 + 2));
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i].index, static_cast<int>(i + 1));
  EXPECT_EQ(c[0].quant, QuantChoice::None);
  EXPECT_FALSE(c[0].double_quant);  // --double-quant only applies to 4-bit
  EXPECT_EQ(c[6].quant, QuantChoice::NF4);
  EXPECT_TRUE(c[6].double_quant);
  EXPECT_EQ(c[4].use_cache, false);
  EXPECT_EQ(c[4].graphs, 0);  // recomputation: no step graphs
  EXPECT_EQ(c[0].label(), "none | eager | graphs on | cache on");
  EXPECT_EQ(c[11].label(), "nf4 dq | flash | graphs off | cache off");
}

TEST(BenchConfigs, ContextNeeded) {
  BenchSpec s = small_spec();
  EXPECT_EQ(bench_ctx_needed(s), 64 + 4);
  s.ctxs = {};
  EXPECT_EQ(bench_ctx_needed(s), 32);  // max(prompts, p0 + n_gen = 20)
  s.ctxs = {100000};
  EXPECT_EQ(bench_ctx_needed(s), 4096);  // capped by the model
}

TEST(BenchRunner, OneLoadPerQuantAndErrorRows) {
  Calls calls;
  std::vector<std::string> stages;
  const BenchResult r = run_bench(small_spec(), fake_loader(calls),
                                  [&](int k, int n, const std::string&, const std::string& st) {
                                    EXPECT_EQ(n, 8);
                                    EXPECT_GE(k, 1);
                                    stages.push_back(st);
                                  });
  ASSERT_EQ(r.configs.size(), 8u);
  EXPECT_EQ(calls.loads, 2);  // none, nf4: attention and cache switch in place
  EXPECT_EQ(calls.load_opts[0].quant, QuantChoice::None);
  EXPECT_FALSE(calls.load_opts[0].double_quant);
  EXPECT_TRUE(calls.load_opts[1].double_quant);
  EXPECT_EQ(calls.load_opts[0].ctx_size, 68);
  for (const ConfigResult& c : r.configs) {
    if (c.config.attn == AttnChoice::Flash) {
      EXPECT_NE(c.error.find("--attn flash"), std::string::npos) << c.error;
      EXPECT_TRUE(c.prefill.empty());
      EXPECT_FALSE(c.has_report);
    } else {
      EXPECT_TRUE(c.error.empty()) << c.error;
      EXPECT_TRUE(c.has_report);
    }
  }
  EXPECT_TRUE(r.configs[0].loaded);
  EXPECT_FALSE(r.configs[2].loaded);  // cache-off of the same quant reuses the engine
  EXPECT_FALSE(stages.empty());
}

TEST(BenchRunner, CellsRepetitionsAndDecodeTokens) {
  Calls calls;
  const BenchResult r = run_bench(small_spec(), fake_loader(calls));
  const ConfigResult& on = r.configs[0];  // none | eager | cache on
  ASSERT_EQ(on.prefill.size(), 2u);
  EXPECT_EQ(on.prefill[0].prompt, 16);
  EXPECT_EQ(on.prefill[1].prompt, 32);
  ASSERT_EQ(on.prefill[0].ttft_ms.runs.size(), 3u);
  EXPECT_NEAR(on.prefill[0].tok_s.median, 16 * 1000.0 / on.prefill[0].ttft_ms.median, 1e-6);
  ASSERT_EQ(on.decode.size(), 2u);
  EXPECT_EQ(on.decode[0].ctx, 8);
  EXPECT_EQ(on.decode[0].tokens, 3);  // n_gen - 1: the first token comes from the prefill
  EXPECT_DOUBLE_EQ(on.decode[0].ms.median, 6.0);
  EXPECT_DOUBLE_EQ(on.decode[0].tok_s.median, 500.0);
  EXPECT_EQ(on.decode[1].ctx, 64);

  const ConfigResult& off = r.configs[2];  // none | eager | cache off
  ASSERT_FALSE(off.config.use_cache);
  ASSERT_EQ(off.prefill.size(), 1u);  // first prompt length only
  EXPECT_EQ(off.prefill[0].prompt, 16);
  ASSERT_EQ(off.decode.size(), 1u);
  EXPECT_EQ(off.decode[0].ctx, 16);
  EXPECT_DOUBLE_EQ(off.decode[0].tok_s.median, 100.0);
}

TEST(BenchRunner, WarmupAndContextFill) {
  Calls calls;
  BenchSpec s = small_spec();
  s.quants = {QuantChoice::None};
  s.attns = {AttnChoice::Eager};
  s.no_cache = false;
  run_bench(s, fake_loader(calls));
  auto count = [&](const std::string& x) { return std::count(calls.log.begin(), calls.log.end(), x); };
  EXPECT_EQ(count("prefill 16@0"), 4);  // 1 warm-up + 3 reps
  EXPECT_EQ(count("prefill 32@0"), 4);
  EXPECT_EQ(count("decode 3@8"), 4);
  EXPECT_EQ(count("prefill 64@0"), 1);  // depth 64 > what the prompts filled: one untimed fill
  const auto fill = std::find(calls.log.begin(), calls.log.end(), "prefill 64@0");
  const auto dec = std::find(calls.log.begin(), calls.log.end(), "decode 3@64");
  EXPECT_LT(fill, dec);
}

TEST(BenchRunner, LoadFailureIsAnErrorRowAndRetried) {
  Calls calls;
  BenchSpec s = small_spec();
  s.quants = {QuantChoice::FP4, QuantChoice::None};
  s.attns = {AttnChoice::Eager, AttnChoice::Sdpa};
  s.no_cache = false;
  const BenchResult r = run_bench(s, fake_loader(calls));
  ASSERT_EQ(r.configs.size(), 4u);
  EXPECT_NE(r.configs[0].error.find("refused by the fake"), std::string::npos);
  EXPECT_NE(r.configs[1].error.find("refused by the fake"), std::string::npos);
  EXPECT_TRUE(r.configs[2].error.empty());
  EXPECT_EQ(calls.loads, 3);
  EXPECT_EQ(r.configs[3].report.attn, "sdpa");
}

TEST(BenchRunner, CellErrorsStayInTheCell) {
  Calls calls;
  BenchSpec s = small_spec();
  s.quants = {QuantChoice::None};
  s.attns = {AttnChoice::Eager};
  s.no_cache = false;
  s.model_max_positions = 40;  // ctx 64 + 4 does not fit
  const BenchResult r = run_bench(s, fake_loader(calls));
  ASSERT_EQ(r.configs.size(), 1u);
  EXPECT_TRUE(r.configs[0].error.empty());
  ASSERT_EQ(r.configs[0].decode.size(), 2u);
  EXPECT_TRUE(r.configs[0].decode[0].error.empty());
  EXPECT_NE(r.configs[0].decode[1].error.find("exceeds the context size"), std::string::npos);
}

TEST(BenchConfigs, GpuLayersDimension) {
  BenchSpec s = small_spec();
  s.gpu_layers = {4, 2, 0};
  s.attns = {AttnChoice::Eager, AttnChoice::Sdpa};
  s.graphs = {-1};
  const auto c = bench_configs(s);
  ASSERT_EQ(c.size(), 2u * 3 * (2 + 2));  // quant x gpu_layers x (attn cache on + attn cache off)
  // quant, then gpu_layers: every attn / graphs / cache configuration of a pair runs from one load
  const std::vector<int> want = {4, 2, 0};
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].index, static_cast<int>(i + 1));
    EXPECT_EQ(c[i].quant, i < 12 ? QuantChoice::None : QuantChoice::NF4) << i;
    EXPECT_EQ(c[i].gpu_layers, want[(i / 4) % 3]) << i;
    EXPECT_EQ(c[i].use_cache, i % 4 < 2) << i;
  }
  EXPECT_EQ(c[0].label(), "none | ngl 4 | eager | graphs auto | cache on");
  EXPECT_EQ(c[23].label(), "nf4 dq | ngl 0 | sdpa | graphs off | cache off");

  // one all or auto entry is the default placement: labels as without --gpu-layers
  s.gpu_layers = {kAutoLayers};
  EXPECT_EQ(bench_configs(s)[0].label(), "none | eager | graphs auto | cache on");
  EXPECT_EQ(bench_configs(s)[0].gpu_layers, kAutoLayers);
  s.gpu_layers = {2};
  EXPECT_EQ(bench_configs(s)[0].label(), "none | ngl 2 | eager | graphs auto | cache on");
  EXPECT_TRUE(default_gpu_layers({kAllLayers}));
  EXPECT_FALSE(default_gpu_layers({kAllLayers, 0}));
}

TEST(BenchRunner, OneLoadPerQuantAndGpuLayers) {
  Calls calls;
  BenchSpec s = small_spec();
  s.gpu_layers = {4, 2, 0};
  s.attns = {AttnChoice::Eager, AttnChoice::Sdpa};
  std::vector<std::string> labels;
  const BenchResult r = run_bench(s, fake_loader(calls), [&](int, int, const std::string& label, const std::string&) {
    if (labels.empty() || labels.back() != label) labels.push_back(label);
  });
  ASSERT_EQ(r.configs.size(), 24u);
  ASSERT_EQ(calls.loads, 6);
  const std::vector<int> want = {4, 2, 0, 4, 2, 0};
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(calls.load_opts[i].gpu_layers, want[i]) << i;
    EXPECT_EQ(calls.load_opts[i].quant, i < 3 ? QuantChoice::None : QuantChoice::NF4) << i;
  }
  for (const ConfigResult& c : r.configs) {
    EXPECT_TRUE(c.error.empty()) << c.config.label() << ": " << c.error;
    EXPECT_EQ(c.loaded, (c.config.index - 1) % 4 == 0) << c.config.index;
    ASSERT_TRUE(c.has_report);
    EXPECT_EQ(c.report.gpu_layers, c.config.gpu_layers);
  }
  EXPECT_EQ(r.configs[4].report.offload_device, "cpu");  // none, 2 of 4 layers on the GPU
  EXPECT_EQ(r.configs[4].report.offloaded_bytes, 200u);
  EXPECT_EQ(labels.front(), "none | ngl 4 | eager | graphs auto | cache on");
}

TEST(BenchRunner, FailedPlacementIsAnErrorRow) {
  Calls calls;
  BenchSpec s = small_spec();
  s.quants = {QuantChoice::None};
  s.base.max_vram = 50;
  s.gpu_layers = {kAutoLayers, 0};
  s.attns = {AttnChoice::Eager, AttnChoice::Sdpa};
  s.no_cache = false;
  const BenchResult r = run_bench(s, fake_loader(calls));
  ASSERT_EQ(r.configs.size(), 4u);
  for (int i : {0, 1}) {
    EXPECT_NE(r.configs[i].error.find("--max-vram 50 bytes: not even one layer fits"), std::string::npos)
        << r.configs[i].error;
    EXPECT_FALSE(r.configs[i].has_report);
    EXPECT_TRUE(r.configs[i].prefill.empty());
  }
  for (int i : {2, 3}) EXPECT_TRUE(r.configs[i].error.empty()) << r.configs[i].error;
  EXPECT_EQ(calls.loads, 3);  // the failed load is tried again for the next configuration, then gpu_layers 0
  EXPECT_EQ(calls.load_opts[0].max_vram, 50u);
  EXPECT_EQ(calls.load_opts[2].gpu_layers, 0);
  EXPECT_EQ(r.configs[2].report.gpu_layers, 0);
}

}  // namespace
}  // namespace nf4flash
