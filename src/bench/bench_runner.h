// The benchmark matrix behind `nf4flash bench`: configurations = quant x gpu_layers x attn x graphs
// (cache on), plus one cache-off configuration per quant x gpu_layers x attn when asked (measured
// at the first prompt length only: it recomputes the whole context every token). Per
// configuration: TTFT per prompt length, prefill tok/s, decode tok/s per context depth (the first
// generated token excluded: it comes from the prefill), each over `reps` repetitions after
// `warmup` unrecorded runs; peak VRAM and host RSS; the exact paths from Engine::report().
//
// The engine is loaded once per (quant, gpu_layers) pair and reconfigured in place for attn /
// graphs / cache (none of them changes the weights or where they live); a load failure or an
// attention path the backend cannot serve becomes an error row with the engine's reason, never a
// silent substitute. The runner talks to the engine through BenchEngine so the matrix logic is
// testable with a fake.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nf4flash/engine.h"
#include "nf4flash/options.h"

namespace nf4flash {

// What the runner needs from a loaded engine.
class BenchEngine {
 public:
  virtual ~BenchEngine() = default;
  virtual EngineReport report() const = 0;
  virtual int64_t ctx_size() const = 0;
  // Switches attention / CUDA graphs / KV cache without reloading. Returns "" when done, else the
  // reason the backend cannot serve it (the engine is left unchanged).
  // graphs: 1 on, 0 off, -1 the backend's default (on where supported).
  virtual std::string configure(AttnChoice attn, int graphs, bool use_cache) = 0;
  // ms to the logits of an n-token prompt at positions [pos0, pos0+n), device-synchronized.
  virtual double prefill_ms(int64_t n, int64_t pos0) = 0;
  // ms for n cached decode steps at positions [pos0, pos0+n) (positions < pos0 already filled).
  virtual double decode_ms(int64_t n, int64_t pos0) = 0;
  // Generation without the KV cache: prompt of `prompt` tokens, then n_decode more tokens each
  // recomputing the whole context. Returns the ms of those n_decode tokens.
  virtual double decode_nocache_ms(int64_t prompt, int64_t n_decode) = 0;
};

using BenchLoader = std::function<std::unique_ptr<BenchEngine>(const LoadOptions&, const ProgressFn&)>;
// The real loader: Engine::load_preset(preset, ...) when preset is non-empty, else Engine::load.
BenchLoader engine_bench_loader(const std::string& preset);
// Adapter over a loaded Engine (takes ownership).
std::unique_ptr<BenchEngine> wrap_engine(std::unique_ptr<Engine> e);

struct BenchSpec {
  std::string model;                       // folder, or "" with preset
  std::string preset;                      // synthetic preset name, or ""
  LoadOptions base;                        // device, compute, threads, ubatch, blocksize, tf32, ctx_size, max_vram
  std::vector<QuantChoice> quants{QuantChoice::Auto};
  bool double_quant = false;               // applied to the 4-bit entries of `quants`
  // LoadOptions::gpu_layers values (kAllLayers, kAutoLayers or N): layers [0, N) on the GPU, the
  // rest on the CPU backend. One entry that is all or auto is the default placement.
  std::vector<int> gpu_layers{kAllLayers};
  std::vector<AttnChoice> attns{AttnChoice::Auto};
  std::vector<int> graphs{-1};             // 1 on, 0 off, -1 backend default (on where supported)
  bool no_cache = false;                   // add the cache-off configurations
  std::vector<int64_t> prompts{512};
  int n_gen = 128;                         // generated tokens; decode measures n_gen - 1 steps
  std::vector<int64_t> ctxs;               // decode context depths (empty: the first prompt length)
  int reps = 3;
  int warmup = 1;
  int64_t model_max_positions = 0;         // caps the KV cache size the runner asks for (0: no cap)
};

struct BenchStat {
  std::vector<double> runs;  // every repetition, in order
  double median = 0, min = 0, max = 0;
};
BenchStat make_stat(std::vector<double> runs);

struct PrefillCell {
  int64_t prompt = 0;
  BenchStat ttft_ms, tok_s;
  std::string error;
};

struct DecodeCell {
  int64_t ctx = 0;     // KV positions filled before the first timed step
  int64_t tokens = 0;  // timed decode steps (n_gen - 1)
  BenchStat ms, tok_s;
  std::string error;
};

struct BenchConfig {
  int index = 0;  // 1-based
  QuantChoice quant = QuantChoice::Auto;
  bool double_quant = false;
  AttnChoice attn = AttnChoice::Auto;
  int graphs = -1;
  bool use_cache = true;
  int gpu_layers = kAllLayers;   // LoadOptions::gpu_layers of the load
  bool show_gpu_layers = false;  // the spec's gpu_layers list is not the default: label() names it
  // "nf4 dq | flash | graphs on | cache on"; "nf4 dq | ngl 24 | flash | graphs on | cache on" with
  // show_gpu_layers
  std::string label() const;
};
// True when the list is the default placement: one entry, all or auto.
bool default_gpu_layers(const std::vector<int>& gpu_layers);

struct ConfigResult {
  BenchConfig config;
  std::string error;      // non-empty: this configuration could not run (error row)
  bool has_report = false;
  EngineReport report;    // what actually ran
  bool loaded = false;    // this configuration (re)loaded the engine
  double load_ms = 0;
  std::vector<PrefillCell> prefill;
  std::vector<DecodeCell> decode;
  size_t peak_vram_bytes = 0;      // max(total - free) sampled after load and each timed section
  size_t host_peak_rss_bytes = 0;  // VmHWM at the end of the configuration
  double wall_s = 0;
};

struct BenchResult {
  BenchSpec spec;
  std::vector<ConfigResult> configs;
  size_t peak_vram_bytes = 0, host_peak_rss_bytes = 0;
  double total_s = 0;
};

// Progress: configuration k of n, its label, and the stage ("load", "prefill 512 (rep 2/3)", ...).
using BenchProgress = std::function<void(int k, int n, const std::string& label, const std::string& stage)>;
// VRAM in use on the engine's device (bytes), or 0 when unknown / no GPU.
using VramSampler = std::function<size_t()>;
VramSampler default_vram_sampler();

// The configurations in the order they run (grouped by quant, then gpu_layers, so one load serves a
// group).
std::vector<BenchConfig> bench_configs(const BenchSpec& spec);
// The KV cache size the runner loads with: what the largest prompt / depth + n_gen needs.
int64_t bench_ctx_needed(const BenchSpec& spec);

BenchResult run_bench(const BenchSpec& spec, const BenchLoader& loader, const BenchProgress& progress = nullptr,
                      const VramSampler& vram = nullptr);

std::string quant_choice_name(QuantChoice q);
std::string attn_choice_name(AttnChoice a);
std::string graphs_name(int g);  // "on" | "off" | "auto"

}  // namespace nf4flash
