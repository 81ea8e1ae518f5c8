// The benchmark matrix runner (see bench_runner.h): configuration enumeration, engine reuse per
// (quant, gpu_layers), warm-up + repetitions per cell, VRAM/RSS sampling, and the Engine adapter
// that switches attention / graphs / cache in place through Engine::internals().
#include "bench/bench_runner.h"

#include <algorithm>
#include <chrono>
#include <new>

#include "backend/device_info.h"
#include "core/error.h"
#include "runtime/engine_impl.h"
#include "runtime/placement.h"

namespace nf4flash {

namespace {

using Clock = std::chrono::steady_clock;

AttnImpl to_impl(AttnChoice a) {
  switch (a) {
    case AttnChoice::Flash: return AttnImpl::Flash;
    case AttnChoice::Sdpa: return AttnImpl::Sdpa;
    case AttnChoice::Eager: return AttnImpl::Eager;
    default: return AttnImpl::Auto;
  }
}

// The adapter over a real Engine. Attention, graphs and cache are runtime switches of the loaded
// engine (Decoder::set_attn_impl, Impl::opts), so none of them needs a reload.
class EngineAdapter final : public BenchEngine {
 public:
  explicit EngineAdapter(std::unique_ptr<Engine> e) : e_(std::move(e)) {}

  EngineReport report() const override { return e_->report(); }
  int64_t ctx_size() const override { return e_->ctx_size(); }

  std::string configure(AttnChoice attn, int graphs, bool use_cache) override {
    Engine::Impl& im = e_->internals();
    const AttnImpl impl = to_impl(attn);
    // Same check (and message) as the engine's load; Auto is checked too (e.g. head_dim 48 on CUDA).
    const std::string why = im.be->attn_unsupported_reason(impl, im.cfg.head_dim);
    if (!why.empty()) return why;
    if (graphs == 1 && !im.be->graphs_supported())
      return cat("--graphs on: the ", im.report.device, " backend has no step graphs (CUDA graphs need --device cuda; use --graphs off or auto)");
    if (impl != im.dec->attn_impl()) {
      im.dec->set_attn_impl(impl);
      im.step_graph.reset();  // a captured decode step holds the previous attention kernel
      // the engine's reporting rule (build_engine): CPU runs its eager kernel; CUDA auto = the
      // first of flash, sdpa, eager that serves (what the backend runs for auto)
      AttnImpl ran = impl;
      for (AttnImpl a : {AttnImpl::Flash, AttnImpl::Sdpa, AttnImpl::Eager})
        if (ran == AttnImpl::Auto && im.be->attn_unsupported_reason(a, im.cfg.head_dim).empty()) ran = a;
      im.report.attn = im.be->device() == Device::CPU ? "cpu-eager" : im.be->attn_path(ran);
    }
    im.opts.graphs = graphs != 0;
    im.report.graphs = im.opts.graphs && im.be->graphs_supported();
    im.opts.use_cache = use_cache;
    im.report.use_cache = use_cache;
    return "";
  }

  double prefill_ms(int64_t n, int64_t pos0) override { return e_->bench_prefill(n, pos0); }
  double decode_ms(int64_t n, int64_t pos0) override { return e_->bench_decode(n, pos0); }

  double decode_nocache_ms(int64_t prompt, int64_t n_decode) override {
    std::vector<int32_t> ids(static_cast<size_t>(prompt));
    const int64_t V = e_->vocab_size();
    for (int64_t i = 0; i < prompt; ++i) ids[i] = static_cast<int32_t>((i * 7919 + 13) % V);
    GenerateOptions g;
    g.max_new_tokens = static_cast<int>(n_decode + 1);  // the first token comes from the prefill
    g.ignore_eos = true;
    g.reuse_cache = false;
    const GenerateResult r = e_->generate(ids, g);
    NF4FLASH_CHECK(r.timing.decode_tokens == n_decode, "bench: generation without cache stopped after ",
                   r.timing.decode_tokens, " of ", n_decode, " decode tokens (", r.stop_reason, ")");
    return r.timing.decode_ms;
  }

 private:
  std::unique_ptr<Engine> e_;
};

}  // namespace

std::unique_ptr<BenchEngine> wrap_engine(std::unique_ptr<Engine> e) {
  return std::make_unique<EngineAdapter>(std::move(e));
}

BenchLoader engine_bench_loader(const std::string& preset) {
  return [preset](const LoadOptions& o, const ProgressFn& p) -> std::unique_ptr<BenchEngine> {
    LoadOptions lo = o;
    lo.load_tokenizer = false;  // the benchmark feeds token ids
    return wrap_engine(preset.empty() ? Engine::load(lo, p) : Engine::load_preset(preset, lo, p));
  };
}

VramSampler default_vram_sampler() {
  return []() -> size_t {
    size_t f = 0, t = 0;
    if (!gpu_memory(0, &f, &t) || t < f) return 0;
    return t - f;
  };
}

std::string quant_choice_name(QuantChoice q) {
  switch (q) {
    case QuantChoice::None: return "none";
    case QuantChoice::NF4: return "nf4";
    case QuantChoice::FP4: return "fp4";
    default: return "auto";
  }
}

std::string attn_choice_name(AttnChoice a) {
  switch (a) {
    case AttnChoice::Flash: return "flash";
    case AttnChoice::Sdpa: return "sdpa";
    case AttnChoice::Eager: return "eager";
    default: return "auto";
  }
}

std::string graphs_name(int g) { return g > 0 ? "on" : g == 0 ? "off" : "auto"; }

std::string BenchConfig::label() const {
  return cat(quant_choice_name(quant), double_quant ? " dq" : "",
             show_gpu_layers ? " | ngl " + gpu_layers_name(gpu_layers) : std::string(), " | ", attn_choice_name(attn),
             " | graphs ", graphs_name(graphs), " | cache ", use_cache ? "on" : "off");
}

bool default_gpu_layers(const std::vector<int>& g) {
  return g.size() == 1 && (g.front() == kAllLayers || g.front() == kAutoLayers);
}

BenchStat make_stat(std::vector<double> runs) {
  BenchStat s;
  s.runs = runs;
  if (runs.empty()) return s;
  std::sort(runs.begin(), runs.end());
  const size_t n = runs.size();
  s.median = n % 2 ? runs[n / 2] : 0.5 * (runs[n / 2 - 1] + runs[n / 2]);
  s.min = runs.front();
  s.max = runs.back();
  return s;
}

std::vector<BenchConfig> bench_configs(const BenchSpec& spec) {
  std::vector<BenchConfig> out;
  const bool show = !default_gpu_layers(spec.gpu_layers);
  for (QuantChoice q : spec.quants) {
    const bool dq = spec.double_quant && q != QuantChoice::None;
    for (int ngl : spec.gpu_layers) {
      for (AttnChoice a : spec.attns)
        for (int g : spec.graphs) out.push_back({0, q, dq, a, g, true, ngl, show});
      if (spec.no_cache)  // recomputation runs prefill kernels every token: step graphs do not apply
        for (AttnChoice a : spec.attns) out.push_back({0, q, dq, a, 0, false, ngl, show});
    }
  }
  for (size_t i = 0; i < out.size(); ++i) out[i].index = static_cast<int>(i + 1);
  return out;
}

int64_t bench_ctx_needed(const BenchSpec& spec) {
  int64_t need = 1;
  for (int64_t p : spec.prompts) need = std::max(need, p);
  const int64_t p0 = spec.prompts.empty() ? 0 : spec.prompts.front();
  if (spec.ctxs.empty()) need = std::max<int64_t>(need, p0 + spec.n_gen);
  for (int64_t c : spec.ctxs) need = std::max<int64_t>(need, c + spec.n_gen);
  if (spec.no_cache) need = std::max<int64_t>(need, p0 + spec.n_gen);
  if (spec.model_max_positions > 0) need = std::min(need, spec.model_max_positions);
  return need;
}

namespace {

// One configuration on a loaded, configured engine.
class CellRunner {
 public:
  CellRunner(const BenchSpec& spec, BenchEngine& eng, ConfigResult& cr, int64_t& filled,
             const std::function<void(const std::string&)>& stage, const std::function<void()>& sample)
      : spec_(spec), eng_(eng), cr_(cr), filled_(filled), stage_(stage), sample_(sample) {}

  void run() {
    const bool cache = cr_.config.use_cache;
    std::vector<int64_t> prompts = spec_.prompts;
    if (!cache && !prompts.empty()) prompts.resize(1);
    for (int64_t p : prompts) prefill_cell(p);
    if (spec_.n_gen < 2) return;  // the first token comes from the prefill: nothing left to decode
    if (!cache) {
      if (!prompts.empty()) decode_cell(prompts.front(), false);
      return;
    }
    std::vector<int64_t> depths = spec_.ctxs;
    if (depths.empty() && !spec_.prompts.empty()) depths.push_back(spec_.prompts.front());
    for (int64_t c : depths) decode_cell(c, true);
  }

 private:
  template <typename F>
  std::vector<double> repeat(const std::string& what, F&& timed) {
    for (int w = 0; w < spec_.warmup; ++w) {
      stage_(cat(what, " (warm-up)"));
      timed();
    }
    std::vector<double> runs;
    for (int r = 0; r < spec_.reps; ++r) {
      stage_(cat(what, " (rep ", r + 1, "/", spec_.reps, ")"));
      runs.push_back(timed());
    }
    return runs;
  }

  // Runs body (the timed runs in ms) into time and tok/s stats for tokens a run; an engine error or
  // host allocation failure becomes the cell's error.
  template <typename Body>
  void measure(int64_t tokens, BenchStat& time, BenchStat& tok_s, std::string& error, Body body) {
    try {
      const std::vector<double> ms = body();
      std::vector<double> tps;
      for (double m : ms) tps.push_back(m > 0 ? tokens * 1000.0 / m : 0.0);
      time = make_stat(ms);
      tok_s = make_stat(tps);
    } catch (const Error& e) {
      error = e.what();
    } catch (const std::bad_alloc&) {
      error = "out of host memory";
    }
    sample_();
  }

  void prefill_cell(int64_t p) {
    PrefillCell c;
    c.prompt = p;
    measure(p, c.ttft_ms, c.tok_s, c.error, [&] {
      std::vector<double> ms = repeat(cat("prefill ", p), [&] { return eng_.prefill_ms(p, 0); });
      filled_ = std::max(filled_, p);
      return ms;
    });
    cr_.prefill.push_back(std::move(c));
  }

  void decode_cell(int64_t ctx, bool cache) {
    DecodeCell c;
    c.ctx = ctx;
    c.tokens = spec_.n_gen - 1;
    measure(c.tokens, c.ms, c.tok_s, c.error, [&] {
      std::vector<double> ms;
      if (cache) {
        if (filled_ < ctx) {  // the KV positions before ctx must hold something: prefill them (untimed)
          stage_(cat("filling context ", ctx));
          eng_.prefill_ms(ctx, 0);
          filled_ = ctx;
        }
        ms = repeat(cat("decode ", c.tokens, " @ ctx ", ctx), [&] { return eng_.decode_ms(c.tokens, ctx); });
      } else {
        ms = repeat(cat("decode ", c.tokens, " without cache @ ctx ", ctx),
                    [&] { return eng_.decode_nocache_ms(ctx, c.tokens); });
      }
      filled_ = std::max(filled_, ctx + c.tokens);
      return ms;
    });
    cr_.decode.push_back(std::move(c));
  }

  const BenchSpec& spec_;
  BenchEngine& eng_;
  ConfigResult& cr_;
  int64_t& filled_;
  const std::function<void(const std::string&)>& stage_;
  const std::function<void()>& sample_;
};

}  // namespace

BenchResult run_bench(const BenchSpec& spec, const BenchLoader& loader, const BenchProgress& progress,
                      const VramSampler& vram) {
  NF4FLASH_CHECK(!spec.prompts.empty(), "bench: -p needs at least one prompt length");
  NF4FLASH_CHECK(spec.reps >= 1, "bench: -r must be at least 1");
  const auto t_start = Clock::now();
  BenchResult res;
  res.spec = spec;
  res.host_peak_rss_bytes = host_peak_rss_bytes();
  const std::vector<BenchConfig> configs = bench_configs(spec);
  const int n = static_cast<int>(configs.size());

  std::unique_ptr<BenchEngine> eng;
  QuantChoice eng_quant = QuantChoice::Auto;
  bool eng_dq = false;
  int eng_gpu_layers = kAllLayers;
  int64_t filled = 0;  // KV positions [0, filled) written since the engine was loaded

  for (const BenchConfig& cfg : configs) {
    ConfigResult cr;
    cr.config = cfg;
    const auto t0 = Clock::now();
    host_reset_peak_rss();
    const std::string label = cfg.label();
    std::function<void(const std::string&)> stage = [&](const std::string& s) {
      if (progress) progress(cfg.index, n, label, s);
    };
    std::function<void()> sample = [&] {
      const size_t v = vram ? vram() : 0;
      cr.peak_vram_bytes = std::max(cr.peak_vram_bytes, v);
    };

    if (!eng || eng_quant != cfg.quant || eng_dq != cfg.double_quant || eng_gpu_layers != cfg.gpu_layers) {
      eng.reset();  // free the previous weights before loading the next ones
      LoadOptions o = spec.base;
      o.model_dir = spec.model;
      o.quant = cfg.quant;
      o.double_quant = cfg.double_quant;
      o.gpu_layers = cfg.gpu_layers;
      o.attn = cfg.attn;
      o.graphs = cfg.graphs != 0;
      o.use_cache = cfg.use_cache;
      if (o.ctx_size <= 0) o.ctx_size = bench_ctx_needed(spec);
      stage("loading");
      try {
        eng = loader(o, [&](const std::string& s, int done, int total) { stage(cat(s, " ", done, "/", total)); });
        cr.loaded = true;
        gpu_profiler_start();  // a profiler started with collection off skips the load's kernels
        cr.load_ms = eng->report().load_ms;
        eng_quant = cfg.quant;
        eng_dq = cfg.double_quant;
        eng_gpu_layers = cfg.gpu_layers;
        filled = 0;
      } catch (const Error& e) {
        cr.error = e.what();
        eng.reset();
      } catch (const std::bad_alloc&) {
        cr.error = "out of host memory while loading";
        eng.reset();
      }
      sample();
    }
    if (eng && cr.error.empty()) {
      try {
        cr.error = eng->configure(cfg.attn, cfg.graphs, cfg.use_cache);
      } catch (const Error& e) {
        cr.error = e.what();
      }
    }
    if (eng && cr.error.empty()) {
      cr.report = eng->report();
      cr.has_report = true;
      CellRunner(spec, *eng, cr, filled, stage, sample).run();
    } else if (cr.error.empty()) {
      cr.error = "engine not loaded";
    }
    cr.host_peak_rss_bytes = host_peak_rss_bytes();
    cr.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    stage(cr.error.empty() ? cat("done in ", static_cast<int64_t>(cr.wall_s * 10 + 0.5) / 10.0, " s") : cat("error: ", cr.error));
    res.peak_vram_bytes = std::max(res.peak_vram_bytes, cr.peak_vram_bytes);
    res.host_peak_rss_bytes = std::max(res.host_peak_rss_bytes, cr.host_peak_rss_bytes);
    res.configs.push_back(std::move(cr));
  }
  res.total_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  return res;
}

}  // namespace nf4flash
