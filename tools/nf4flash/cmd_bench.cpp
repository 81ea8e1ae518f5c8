// nf4flash bench: prefill latency (TTFT) and decode tokens/s measured apart, over a matrix of
// quant x gpu-layers x attn x graphs (+ cache-off), on a model folder or a synthetic preset. Progress
// on stderr, a Markdown table on stdout, --json with every raw number, --svg with the charts (and
// the offload cliff over several --gpu-layers values).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include "backend/device_info.h"
#include "bench/bench_batch.h"
#include "bench/bench_report.h"
#include "bench/bench_runner.h"
#include "bench/bench_svg.h"
#include "bench/presets.h"
#include "commands.h"
#include "core/error.h"
#include "io/hf_config.h"
#include "model_flags.h"
#include "runtime/placement.h"

namespace nf4flash::cli {
namespace {

struct BenchArgs {
  ModelFlags model;
  std::string preset, quants = "auto", attns = "auto", graphs = "auto", prompts = "512", ctxs, json, svg, md, batch;
  std::string gpu_layers;  // "": all, or auto with --max-vram
  bool no_cache = false;
  int n_gen = 128, reps = 3, warmup = 1;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A comma list of integers in [min, max]; an entry that is not one is an error naming `what`.
std::vector<int64_t> parse_int_list(const std::string& s, const std::string& flag, int64_t min, int64_t max,
                                    const char* what) {
  std::vector<int64_t> v;
  for (const std::string& item : split_list(s)) {
    size_t pos = 0;
    long long x = -1;
    try {
      x = std::stoll(item, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != item.size() || x < min || x > max) fail(flag, ": '", item, "' is not ", what, " (", min, "..", max, ")");
    v.push_back(x);
  }
  return v;
}

std::vector<int64_t> parse_lengths(const std::string& s, const std::string& flag, int64_t min) {
  std::vector<int64_t> v = parse_int_list(s, flag, min, int64_t{1} << 24, "a token count");
  if (v.empty() && min > 0) fail(flag, ": no values given");
  return v;
}

BenchSpec make_spec(const BenchArgs& a) {
  if (a.preset.empty() == a.model.model.empty()) fail("bench: give exactly one of --model DIR or --preset NAME");
  BenchSpec s;
  s.model = a.model.model;
  s.preset = a.preset;
  s.base = a.model.to_options();
  s.base.model_dir = a.model.model;
  s.model_max_positions = a.preset.empty() ? load_model_config(a.model.model).max_positions
                                           : preset_config(a.preset).max_positions;
  s.quants.clear();
  for (const std::string& q : split_list(a.quants)) {
    if (q == "auto") s.quants.push_back(QuantChoice::Auto);
    else if (q == "none") s.quants.push_back(QuantChoice::None);
    else if (q == "nf4") s.quants.push_back(QuantChoice::NF4);
    else if (q == "fp4") s.quants.push_back(QuantChoice::FP4);
    else fail("--quant: '", q, "' is not one of auto, none, nf4, fp4");
  }
  s.attns.clear();
  for (const std::string& x : split_list(a.attns)) {
    if (x == "auto") s.attns.push_back(AttnChoice::Auto);
    else if (x == "flash") s.attns.push_back(AttnChoice::Flash);
    else if (x == "sdpa") s.attns.push_back(AttnChoice::Sdpa);
    else if (x == "eager") s.attns.push_back(AttnChoice::Eager);
    else fail("--attn: '", x, "' is not one of auto, flash, sdpa, eager");
  }
  s.graphs.clear();
  for (const std::string& x : split_list(a.graphs)) {
    if (x == "on") s.graphs.push_back(1);
    else if (x == "off") s.graphs.push_back(0);
    else if (x == "auto") s.graphs.push_back(-1);
    else fail("--graphs: '", x, "' is not one of on, off, auto");
  }
  s.gpu_layers.clear();
  if (a.gpu_layers.empty()) {
    s.gpu_layers.push_back(s.base.max_vram > 0 ? kAutoLayers : kAllLayers);
  } else {
    for (const std::string& x : split_list(a.gpu_layers)) {
      const int g = parse_gpu_layers(x);  // names --gpu-layers and the entry when it is not one
      if (std::find(s.gpu_layers.begin(), s.gpu_layers.end(), g) != s.gpu_layers.end())
        fail("--gpu-layers: '", x, "' is given twice");
      s.gpu_layers.push_back(g);
    }
    if (s.gpu_layers.empty()) fail("--gpu-layers: no values given");
  }
  if (s.quants.empty()) fail("--quant: no values given");
  if (s.attns.empty()) fail("--attn: no values given");
  if (s.graphs.empty()) fail("--graphs: no values given");
  s.double_quant = a.model.double_quant;
  s.no_cache = a.no_cache;
  s.prompts = parse_lengths(a.prompts, "-p", 1);
  s.ctxs = parse_lengths(a.ctxs, "--ctx", 0);
  s.n_gen = a.n_gen;
  s.reps = a.reps;
  s.warmup = a.warmup;
  return s;
}

// "[3/12] nf4 dq | sdpa | graphs on | cache on: decode 127 @ ctx 512 (rep 2/3)"
BenchProgress make_progress(bool quiet) {
  if (quiet) return nullptr;
  const bool tty = isatty(fileno(stderr));
  return [tty](int k, int n, const std::string& label, const std::string& stage) {
    if (tty) {
      std::fprintf(stderr, "\r\033[K[%d/%d] %s: %s", k, n, label.c_str(), stage.c_str());
    } else {
      // a log file gets one line per stage, not one per repetition or loaded tensor
      std::string s = stage;
      const auto w = s.find(" (warm-up)");
      if (w != std::string::npos) s.erase(w);
      else if (s.find(" (rep ") != std::string::npos || s.rfind("loading weights", 0) == 0) return;
      std::fprintf(stderr, "[%d/%d] %s: %s\n", k, n, label.c_str(), s.c_str());
    }
    std::fflush(stderr);
  };
}

void write_file(const std::string& path, const std::string& text, const char* flag) {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail(flag, " ", path, ": cannot open for writing");
  out << text;
  if (!out.flush()) fail(flag, " ", path, ": write failed");
}

// --batch: the batched engine under load at each batch size (bench/bench_batch.h), one
// configuration (a single --quant, --attn and --graphs, one -p length).
int run_batch_bench_cmd(const BenchArgs& a) {
  const BenchSpec spec = make_spec(a);
  NF4FLASH_CHECK(spec.quants.size() == 1 && spec.gpu_layers.size() == 1 && spec.attns.size() == 1 &&
                     spec.graphs.size() == 1 && spec.prompts.size() == 1 && !spec.no_cache,
                 "bench --batch: give one --quant, one --gpu-layers, one --attn, one --graphs and one -p length "
                 "(no --no-cache)");
  BatchBenchSpec bs;
  bs.batches.clear();
  for (int64_t b : parse_int_list(a.batch, "--batch", 1, 4096, "a batch size in sequences")) bs.batches.push_back(int(b));
  if (bs.batches.empty()) fail("--batch: no batch sizes given");
  bs.prompt = spec.prompts.front();
  bs.n_gen = spec.n_gen;
  bs.warmup = spec.warmup;
  for (const auto& [path, flag] : {std::pair{a.json, "--json"}, std::pair{a.svg, "--svg"}, std::pair{a.md, "--markdown"}})
    if (!path.empty()) write_file(path, "", flag);
  const BenchMeta meta = collect_bench_meta();
  LoadOptions o = spec.base;
  o.model_dir = spec.model;
  o.quant = spec.quants.front();
  o.double_quant = spec.double_quant && o.quant != QuantChoice::None;
  o.gpu_layers = spec.gpu_layers.front();
  o.attn = spec.attns.front();
  o.graphs = spec.graphs.front() != 0;  // auto and on: decode-only steps replay graphs where the backend has them
  o.load_tokenizer = false;
  if (o.ctx_size <= 0) o.ctx_size = std::min<int64_t>(bs.prompt + bs.n_gen, spec.model_max_positions);
  const bool quiet = a.model.quiet;
  auto say = [quiet](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "[bench --batch] %s\n", s.c_str());
  };
  say("loading");
  auto e = spec.preset.empty() ? Engine::load(o) : Engine::load_preset(spec.preset, o);
  if (spec.graphs.front() == 1 && !e->report().graphs)
    fail("--graphs on: the ", e->report().device, " backend has no step graphs (CUDA graphs need --device cuda; use "
         "--graphs off or auto)");
  const BatchBenchResult r = run_batch_bench(*e, bs, spec.preset.empty() ? spec.model : spec.preset, say);
  const std::string md = batch_bench_markdown(r, &meta);
  std::printf("%s", md.c_str());
  std::fflush(stdout);
  if (!a.json.empty()) write_file(a.json, batch_bench_to_json(r, meta).dump(2) + "\n", "--json");
  if (!a.md.empty()) write_file(a.md, md, "--markdown");
  if (!a.svg.empty()) {
    std::string title = cat("nf4flash bench --batch: ", r.model, " -p ", bs.prompt, " -n ", bs.n_gen);
    if (!meta.gpus.empty()) title += cat(" on ", meta.gpus.front().name);
    title += cat(" (commit ", meta.commit, meta.commit_dirty ? "+dirty" : "", ")");
    write_file(a.svg, batch_bench_svg(r, title), "--svg");
  }
  for (const BatchBenchCell& c : r.cells)
    if (c.error.empty()) return 0;
  std::fprintf(stderr, "error: no batch size could run: %s\n", r.cells.empty() ? "none" : r.cells.front().error.c_str());
  return 1;
}

int run_bench_cmd(const BenchArgs& a) {
  if (!a.batch.empty()) return run_batch_bench_cmd(a);
  const BenchSpec spec = make_spec(a);
  // fail on unwritable outputs before a long run, not after it
  for (const auto& [path, flag] : {std::pair{a.json, "--json"}, std::pair{a.svg, "--svg"}, std::pair{a.md, "--markdown"}})
    if (!path.empty()) write_file(path, "", flag);
  const BenchMeta meta = collect_bench_meta();
  const BenchResult r = run_bench(spec, engine_bench_loader(spec.preset), make_progress(a.model.quiet), default_vram_sampler());
  if (!a.model.quiet && isatty(fileno(stderr))) std::fprintf(stderr, "\r\033[K");
  const std::string md = bench_markdown(r, &meta);
  std::printf("%s", md.c_str());
  std::fflush(stdout);
  if (!a.json.empty()) write_file(a.json, bench_to_json(r, meta).dump(2) + "\n", "--json");
  if (!a.md.empty()) write_file(a.md, md, "--markdown");
  if (!a.svg.empty()) {
    std::string title = cat("nf4flash bench: ", spec.preset.empty() ? spec.model : "preset " + spec.preset);
    if (!meta.gpus.empty()) title += cat(" on ", meta.gpus.front().name);
    else title += cat(" on ", meta.host.cpu_model);
    title += cat(" (commit ", meta.commit, meta.commit_dirty ? "+dirty" : "", ")");
    write_file(a.svg, bench_svg(r, title), "--svg");
  }
  size_t ok = 0;
  for (const ConfigResult& c : r.configs) ok += c.error.empty();
  if (ok == 0) {
    std::fprintf(stderr, "error: no configuration could run: %s\n",
                 r.configs.empty() ? "empty matrix" : r.configs.front().error.c_str());
    return 1;
  }
  return 0;
}

const char* kBenchFooter = R"(
Matrix: every --quant x --gpu-layers x --attn x --graphs value runs with the KV cache on;
--no-cache adds one cache-off configuration per --quant x --gpu-layers x --attn, measured at the
first -p length only (it recomputes the whole context for every token). The engine is loaded once
per --quant and --gpu-layers value and switched in place for attention, graphs and cache. A
configuration the backend cannot serve (e.g. --attn flash on CPU) or a load that fails (e.g. a
--max-vram below one layer) is an error row with the reason; nothing is replaced silently.

--gpu-layers N1,N2,... (each N | all | auto): the first N layers on the GPU, the rest on the CPU
backend (0: the whole model on the CPU backend; auto: as many as --max-vram holds). Over several
values, or when layers are offloaded, the table gains a GPU layers column ("24/32") and an offload
cliff table follows: per value, the percentage of the weight bytes offloaded and, per --quant,
decode tok/s at the first --ctx depth and TTFT at the first -p length; --svg adds the cliff chart
(decode tok/s and TTFT against the percentage offloaded, one line per --quant).

Per configuration: TTFT (ms to the first token's logits, device-synchronized) and prefill tok/s for
each -p length; decode tok/s for each --ctx depth over -n minus 1 steps (the first token comes from
the prefill and is excluded; the context is prefilled, untimed, first). Each number is the median
with min-max over -r repetitions after --warmup unrecorded runs. Peak VRAM = max(total - free)
sampled after each load and timed section (device 0, all processes); host peak RSS = VmHWM.
The KV cache is sized to what the largest -p, or --ctx plus -n, needs (unless --ctx-size is given),
capped by the model's max_position_embeddings; a depth beyond it is an error in its cell.

--batch B1,B2,...: instead of the matrix, B requests of -p random tokens and -n new tokens each,
submitted at once to the batched engine (continuous batching over the paged KV cache), per B:
aggregate decode tok/s (steps where every row decodes), per-sequence decode tok/s, TTFT under load,
end-to-end tok/s, KV blocks used at the peak and the pool's size. One --quant, --attn, --graphs
(auto/on: decode-only steps replay CUDA graphs) and -p.

Example (the reference H200 run):
  nf4flash bench --preset llama3-8b --quant none,nf4 --double-quant --attn flash,sdpa,eager \
      -p 512,4096 -n 128 --ctx 512,32768 --no-cache -r 3 --json bench.json --svg bench.svg
  nf4flash bench --preset llama3-8b --quant nf4 --double-quant --batch 1,8,32,64 -p 512 -n 128
The offload cliff, bf16 and NF4 side by side:
  nf4flash bench --preset llama3-8b --quant none,nf4 --double-quant --gpu-layers 32,28,24,16,8,0 \
      -p 512 -n 32 --ctx 512 -r 1 --json cliff.json --svg cliff.svg)";

NF4FLASH_COMMAND("bench", "Measure prefill latency (TTFT) and decode tokens/s over a matrix of settings",
                 [](CLI::App& app) -> CommandRun {
                   auto a = std::make_shared<BenchArgs>();
                   a->model.add(app, false);
                   // the matrix flags replace the single-valued shared ones
                   for (const char* name : {"--quant", "--attn", "--no-cache", "--no-graphs", "--gpu-layers"})
                     app.remove_option(app.get_option(name));
                   app.add_option("--preset", a->preset,
                                  "synthetic model built in memory instead of --model: " + preset_list());
                   app.add_option("--quant", a->quants,
                                  "comma list of none | nf4 | fp4 | auto (auto: what the checkpoint has)")
                       ->capture_default_str();
                   app.add_option("--attn", a->attns, "comma list of flash | sdpa | eager | auto")->capture_default_str();
                   app.add_option("--graphs", a->graphs,
                                  "comma list of on | off | auto (CUDA graphs for the decode step; auto: on where supported)")
                       ->capture_default_str();
                   app.add_option("--gpu-layers", a->gpu_layers,
                                  "comma list of N | all | auto: the first N layers on the GPU, the rest on the CPU "
                                  "backend (default: all, or auto with --max-vram); several values draw the offload cliff");
                   app.add_flag("--no-cache", a->no_cache,
                                "also measure with the KV cache off (use_cache=False), at the first -p length only");
                   app.add_option("-p,--n-prompt", a->prompts, "comma list of prompt lengths for TTFT")->capture_default_str();
                   app.add_option("-n,--n-gen", a->n_gen, "generated tokens per decode run (n-1 timed decode steps)")
                       ->check(CLI::Range(1, 1 << 20))
                       ->capture_default_str();
                   app.add_option("--ctx", a->ctxs,
                                  "comma list of context depths to decode at (default: the first -p length)");
                   app.add_option("-r,--repetitions", a->reps, "timed repetitions per measurement")
                       ->check(CLI::Range(1, 1000))
                       ->capture_default_str();
                   app.add_option("--warmup", a->warmup, "unrecorded warm-up runs before the repetitions")
                       ->check(CLI::Range(0, 100))
                       ->capture_default_str();
                   app.add_option("--batch", a->batch,
                                  "comma list of batch sizes: measure the batched engine instead of the matrix "
                                  "(aggregate and per-sequence decode tok/s, TTFT under load, KV blocks)");
                   app.add_option("--json", a->json, "write every raw number, GPU/driver/CPU, commit and command line here");
                   app.add_option("--svg", a->svg, "write a chart here: TTFT vs prompt length, decode tok/s vs context (and the "
                                  "offload cliff over several --gpu-layers values)");
                   app.add_option("--markdown", a->md, "also write the Markdown table here");
                   app.footer(kBenchFooter);
                   return [a] { return run_bench_cmd(*a); };
                 });

}  // namespace
}  // namespace nf4flash::cli
