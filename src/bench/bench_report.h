// Reporting for `nf4flash bench`: the run's provenance (GPU, driver/runtime, CPU, commit, command
// line, date), the JSON document with every raw number, and the Markdown table printed at the end
// (readable as is on a terminal, pasteable into docs/performance.md).
//
// JSON (schema "nf4flash-bench/1"):
//   schema, date (UTC ISO 8601), command, argv[], commit, commit_dirty, version,
//   host {cpu_model, logical_cores, mem_total_bytes, mem_available_bytes, os, simd},
//   cuda_build, gpus[] {index, name, cc, cc_major, cc_minor, total_bytes, free_bytes, driver_version,
//                       driver_cuda_version, runtime_version, sm_count, bf16, tf32},
//   model {source: "preset"|"folder", name},
//   params {quant[], double_quant, gpu_layers[] ("all"|"auto"|"N"), max_vram (bytes, 0: default),
//           attn[], graphs[], no_cache, prompts[], n_gen, decode_tokens, ctx[], repetitions, warmup,
//           device, compute, threads, ubatch, ctx_size},
//   configs[] {index, label, quant, double_quant, gpu_layers ("all"|"auto"|"N", the request), attn,
//              graphs, use_cache, status: "ok"|"error", error?, loaded, load_ms, wall_s,
//              peak_vram_bytes, host_peak_rss_bytes,
//              report {model, architecture, device, backend, compute_dtype, quant, double_quant,
//                      prequantized, attn, linear_decode, linear_prefill, use_cache, graphs,
//                      decode_pipelined, weight_bytes, kv_bytes, n_layers, gpu_layers,
//                      offload_device ("cpu" | ""), offloaded_bytes, kv_offloaded_bytes, ctx_size,
//                      ubatch, load_ms, checkpoint_bytes, load_gb_s}?,
//              weights_offloaded_fraction? (with the report: offloaded_bytes / weight_bytes, 1
//                                          when gpu_layers 0 runs the whole model on the CPU),
//              prefill[] {prompt, ttft_ms{median,min,max,runs[]}, tok_s{...}, error?},
//              decode[] {ctx, tokens, ms{...}, tok_s{...}, error?}},
//   peak_vram_bytes, host_peak_rss_bytes, total_s
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/device_info.h"
#include "bench/bench_runner.h"

namespace nf4flash {

struct BenchMeta {
  std::string date;     // UTC, ISO 8601
  std::string command;  // the command line, shell-quoted
  std::vector<std::string> argv;
  std::string commit = "unknown";
  bool commit_dirty = false;
  std::string version;
  bool cuda_build = false;
  HostInfo host;
  std::vector<GpuInfo> gpus;
};

// Gathers the provenance of this process: /proc/self/cmdline, git (next to the executable, then the
// working directory; "unknown" outside a git tree), date, host and GPUs.
BenchMeta collect_bench_meta();

nlohmann::json gpu_to_json(const GpuInfo& g);
nlohmann::json host_to_json(const HostInfo& h);
nlohmann::json report_to_json(const EngineReport& r);
// {schema, date, command, argv, commit, commit_dirty, version, host, cuda_build, gpus}: the
// provenance every bench JSON document starts with.
nlohmann::json meta_to_json(const std::string& schema, const BenchMeta& meta);
nlohmann::json bench_to_json(const BenchResult& r, const BenchMeta& meta);

// Markdown: one row per (configuration, test) with median [min-max], then the paths taken per
// configuration, then error rows. `meta` adds a one-line header (GPU, commit). When the gpu_layers
// list has several entries or a configuration is offloaded (bench_shows_offload), the main table
// gains a GPU layers column ("24/32"), the offload cliff table follows it (bench_cliff.h), and the
// paths table gains the bytes offloaded to the CPU.
std::string bench_markdown(const BenchResult& r, const BenchMeta* meta = nullptr);

// Formatting helpers shared with doctor.
std::string format_bytes(size_t b);       // "4.70 GiB", "12.0 MiB"
std::string format_num(double v);         // 3 significant figures-ish: 12345 -> "12345", 1.234 -> "1.23"
std::string shell_quote(const std::string& s);

}  // namespace nf4flash
