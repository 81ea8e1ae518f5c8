// Bench provenance, JSON and Markdown (see bench_report.h for the JSON schema).
#include "bench/bench_report.h"

#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/bench_cliff.h"
#include "core/error.h"
#include "runtime/placement.h"

namespace nf4flash {

namespace {

// stdout of a shell command (trailing newline trimmed); "" on failure.
std::string run_capture(const std::string& cmd, bool* ok = nullptr) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    if (ok) *ok = false;
    return out;
  }
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  if (ok) *ok = rc == 0;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::vector<std::string> self_argv() {
  std::vector<std::string> v;
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string arg;
  while (std::getline(in, arg, '\0')) v.push_back(arg);
  return v;
}

std::string md_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '|') o += "\\|";
    else if (c == '\n') o += ' ';
    else o += c;
  }
  return o;
}

std::string stat_cell(const BenchStat& s) {
  if (s.runs.empty()) return "-";
  if (s.runs.size() == 1) return format_num(s.median);
  return cat(format_num(s.median), " (", format_num(s.min), "-", format_num(s.max), ")");
}

// Weights and KV cache on the CPU backend: "3.50 GiB + KV 256.0 MiB", "all" (gpu_layers 0), "-".
std::string offloaded_cell(const ConfigResult& c) {
  if (!config_offloaded(c)) return "-";
  if (c.config.gpu_layers == 0) return "all";
  return cat(format_bytes(c.report.offloaded_bytes), " + KV ", format_bytes(c.report.kv_offloaded_bytes));
}

nlohmann::json stat_json(const BenchStat& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}, {"runs", s.runs}};
}

}  // namespace

std::string format_bytes(size_t b) {
  char buf[64];
  if (b >= (size_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(size_t{1} << 30));
  else if (b >= (size_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1 << 20));
  else std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

std::string format_num(double v) {
  char buf[64];
  const double a = v < 0 ? -v : v;
  if (a >= 100) std::snprintf(buf, sizeof buf, "%.0f", v);
  else if (a >= 10) std::snprintf(buf, sizeof buf, "%.1f", v);
  else std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,/:=+@%") ==
                        std::string::npos)
    return s;
  std::string o = "'";
  for (char c : s) {
    if (c == '\'') o += "'\\''";
    else o += c;
  }
  return o + "'";
}

BenchMeta collect_bench_meta() {
  BenchMeta m;
  char buf[64];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  m.date = buf;
  m.argv = self_argv();
  for (size_t i = 0; i < m.argv.size(); ++i) m.command += (i ? " " : "") + shell_quote(m.argv[i]);
  if (m.command.empty()) m.command = "nf4flash bench";
#ifdef NF4FLASH_GIT_COMMIT
  m.commit = NF4FLASH_GIT_COMMIT;
#else
  std::vector<std::string> dirs;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back(exe.parent_path().string());
  dirs.push_back(".");
  for (const std::string& d : dirs) {
    bool ok = false;
    const std::string c = run_capture("git -C " + shell_quote(d) + " rev-parse --short HEAD 2>/dev/null", &ok);
    if (ok && !c.empty()) {
      m.commit = c;
      m.commit_dirty =
          !run_capture("git -C " + shell_quote(d) + " status --porcelain --untracked-files=no 2>/dev/null").empty();
      break;
    }
  }
#endif
  m.version = NF4FLASH_VERSION;
  m.cuda_build = built_with_cuda();
  m.host = query_host();
  m.gpus = query_gpus();
  return m;
}

nlohmann::json gpu_to_json(const GpuInfo& g) {
  return {{"index", g.index},
          {"name", g.name},
          {"cc", cat(g.cc_major, ".", g.cc_minor)},
          {"cc_major", g.cc_major},
          {"cc_minor", g.cc_minor},
          {"total_bytes", g.total_bytes},
          {"free_bytes", g.free_bytes},
          {"driver_version", g.driver_version},
          {"driver_cuda_version", g.driver_cuda_version},
          {"runtime_version", g.runtime_version},
          {"sm_count", g.sm_count},
          {"bf16", g.bf16},
          {"tf32", g.tf32}};
}

nlohmann::json host_to_json(const HostInfo& h) {
  return {{"cpu_model", h.cpu_model},
          {"logical_cores", h.logical_cores},
          {"mem_total_bytes", h.mem_total_bytes},
          {"mem_available_bytes", h.mem_available_bytes},
          {"os", h.os},
          {"simd", h.simd}};
}

nlohmann::json report_to_json(const EngineReport& r) {
  return {{"model", r.model},
          {"architecture", r.architecture},
          {"device", r.device},
          {"backend", r.backend},
          {"compute_dtype", r.compute_dtype},
          {"quant", r.quant},
          {"double_quant", r.double_quant},
          {"prequantized", r.prequantized},
          {"attn", r.attn},
          {"linear_decode", r.linear_decode},
          {"linear_prefill", r.linear_prefill},
          {"use_cache", r.use_cache},
          {"graphs", r.graphs},
          {"decode_pipelined", r.decode_pipelined},
          {"weight_bytes", r.weight_bytes},
          {"kv_bytes", r.kv_bytes},
          {"n_layers", r.n_layers},
          {"gpu_layers", r.gpu_layers},
          {"offload_device", r.offload_device},
          {"offloaded_bytes", r.offloaded_bytes},
          {"kv_offloaded_bytes", r.kv_offloaded_bytes},
          {"ctx_size", r.ctx_size},
          {"tp", r.tp},
          {"ubatch", r.ubatch},
          {"load_ms", r.load_ms},
          {"checkpoint_bytes", r.checkpoint_bytes},
          {"load_gb_s", r.checkpoint_bytes > 0 && r.load_ms > 0 ? r.checkpoint_bytes / (r.load_ms * 1e6) : 0.0}};
}

nlohmann::json meta_to_json(const std::string& schema, const BenchMeta& meta) {
  using nlohmann::json;
  json j;
  j["schema"] = schema;
  j["date"] = meta.date;
  j["command"] = meta.command;
  j["argv"] = meta.argv;
  j["commit"] = meta.commit;
  j["commit_dirty"] = meta.commit_dirty;
  j["version"] = meta.version;
  j["host"] = host_to_json(meta.host);
  j["cuda_build"] = meta.cuda_build;
  j["gpus"] = json::array();
  for (const GpuInfo& g : meta.gpus) j["gpus"].push_back(gpu_to_json(g));
  return j;
}

nlohmann::json bench_to_json(const BenchResult& r, const BenchMeta& meta) {
  using nlohmann::json;
  const BenchSpec& s = r.spec;
  json j = meta_to_json("nf4flash-bench/1", meta);
  j["model"] = {{"source", s.preset.empty() ? "folder" : "preset"}, {"name", s.preset.empty() ? s.model : s.preset}};
  json q = json::array(), a = json::array(), g = json::array(), ngl = json::array();
  for (QuantChoice x : s.quants) q.push_back(quant_choice_name(x));
  for (int x : s.gpu_layers) ngl.push_back(gpu_layers_name(x));
  for (AttnChoice x : s.attns) a.push_back(attn_choice_name(x));
  for (int x : s.graphs) g.push_back(graphs_name(x));
  const char* dev = s.base.device == DeviceChoice::CUDA ? "cuda" : s.base.device == DeviceChoice::CPU ? "cpu" : "auto";
  const char* comp = s.base.compute == ComputeDType::F32    ? "f32"
                     : s.base.compute == ComputeDType::BF16 ? "bf16"
                     : s.base.compute == ComputeDType::F16  ? "f16"
                                                            : "auto";
  j["params"] = {{"quant", q},
                 {"double_quant", s.double_quant},
                 {"gpu_layers", ngl},
                 {"max_vram", s.base.max_vram},
                 {"attn", a},
                 {"graphs", g},
                 {"no_cache", s.no_cache},
                 {"prompts", s.prompts},
                 {"n_gen", s.n_gen},
                 {"decode_tokens", std::max(0, s.n_gen - 1)},
                 {"ctx", s.ctxs},
                 {"repetitions", s.reps},
                 {"warmup", s.warmup},
                 {"device", dev},
                 {"compute", comp},
                 {"threads", s.base.threads},
                 {"ubatch", s.base.ubatch},
                 {"ctx_size", s.base.ctx_size > 0 ? s.base.ctx_size : bench_ctx_needed(s)}};
  j["configs"] = json::array();
  for (const ConfigResult& c : r.configs) {
    json cj;
    cj["index"] = c.config.index;
    cj["label"] = c.config.label();
    cj["quant"] = quant_choice_name(c.config.quant);
    cj["double_quant"] = c.config.double_quant;
    cj["gpu_layers"] = gpu_layers_name(c.config.gpu_layers);
    cj["attn"] = attn_choice_name(c.config.attn);
    cj["graphs"] = graphs_name(c.config.graphs);
    cj["use_cache"] = c.config.use_cache;
    cj["status"] = c.error.empty() ? "ok" : "error";
    if (!c.error.empty()) cj["error"] = c.error;
    cj["loaded"] = c.loaded;
    cj["load_ms"] = c.load_ms;
    cj["wall_s"] = c.wall_s;
    cj["peak_vram_bytes"] = c.peak_vram_bytes;
    cj["host_peak_rss_bytes"] = c.host_peak_rss_bytes;
    if (c.has_report) {
      cj["report"] = report_to_json(c.report);
      cj["weights_offloaded_fraction"] = weights_offloaded_fraction(c);
    }
    cj["prefill"] = json::array();
    for (const PrefillCell& p : c.prefill) {
      json pj = {{"prompt", p.prompt}, {"ttft_ms", stat_json(p.ttft_ms)}, {"tok_s", stat_json(p.tok_s)}};
      if (!p.error.empty()) pj["error"] = p.error;
      cj["prefill"].push_back(pj);
    }
    cj["decode"] = json::array();
    for (const DecodeCell& d : c.decode) {
      json dj = {{"ctx", d.ctx}, {"tokens", d.tokens}, {"ms", stat_json(d.ms)}, {"tok_s", stat_json(d.tok_s)}};
      if (!d.error.empty()) dj["error"] = d.error;
      cj["decode"].push_back(dj);
    }
    j["configs"].push_back(cj);
  }
  j["peak_vram_bytes"] = r.peak_vram_bytes;
  j["host_peak_rss_bytes"] = r.host_peak_rss_bytes;
  j["total_s"] = r.total_s;
  return j;
}

std::string bench_markdown(const BenchResult& r, const BenchMeta* meta) {
  std::ostringstream o;
  const BenchSpec& s = r.spec;
  o << "nf4flash bench: " << (s.preset.empty() ? s.model : "preset " + s.preset);
  if (meta) {
    if (!meta->gpus.empty()) {
      const GpuInfo& g = meta->gpus.front();
      o << " | " << g.name << " (sm_" << g.cc_major << g.cc_minor << ", CUDA " << g.runtime_version << ")";
    } else {
      o << " | " << meta->host.cpu_model << " (" << meta->host.logical_cores << " threads)";
    }
    o << " | commit " << meta->commit << (meta->commit_dirty ? "+dirty" : "");
  }
  o << " | " << s.reps << " rep" << (s.reps == 1 ? "" : "s") << " + " << s.warmup << " warm-up, median (min-max)\n\n";

  const bool offload = bench_shows_offload(r);
  o << "| # | quant | " << (offload ? "GPU layers | " : "") << "attn | graphs | cache | test | ms | tok/s |\n";
  o << "|--:|---|" << (offload ? "--:|" : "") << "---|---|---|---|--:|--:|\n";
  bool any_error = false;
  for (const ConfigResult& c : r.configs) {
    const BenchConfig& k = c.config;
    const std::string ngl = offload ? config_gpu_layers_cell(c) + " | " : std::string();
    const std::string head = cat("| ", k.index, " | ", quant_choice_name(k.quant), k.double_quant ? " dq" : "", " | ", ngl,
                                 attn_choice_name(k.attn), " | ", graphs_name(k.graphs), " | ", k.use_cache ? "on" : "off",
                                 " | ");
    if (!c.error.empty()) {
      any_error = true;
      o << head << "error | - | - |\n";
      continue;
    }
    for (const PrefillCell& p : c.prefill) {
      if (!p.error.empty()) any_error = true;
      o << head << "TTFT pp" << p.prompt << " | " << (p.error.empty() ? stat_cell(p.ttft_ms) : "error") << " | "
        << (p.error.empty() ? stat_cell(p.tok_s) : "-") << " |\n";
    }
    for (const DecodeCell& d : c.decode) {
      if (!d.error.empty()) any_error = true;
      o << head << "decode tg" << d.tokens << " @ d" << d.ctx << " | "
        << (d.error.empty() ? stat_cell(d.ms) : "error") << " | " << (d.error.empty() ? stat_cell(d.tok_s) : "-")
        << " |\n";
    }
  }

  o << bench_cliff_markdown(r);

  o << "\n| # | device | compute | attention | linear decode | linear prefill | ubatch | graphs | weights | KV cache | "
    << (offload ? "offloaded to CPU | " : "") << "peak VRAM | host peak RSS | load ms |\n";
  o << "|--:|---|---|---|---|---|--:|---|--:|--:|" << (offload ? "--:|" : "") << "--:|--:|--:|\n";
  for (const ConfigResult& c : r.configs) {
    if (!c.has_report) continue;
    const EngineReport& e = c.report;
    o << "| " << c.config.index << " | " << md_escape(e.device) << " | " << e.compute_dtype << " | " << md_escape(e.attn)
      << " | " << md_escape(e.linear_decode) << " | " << md_escape(e.linear_prefill) << " | " << e.ubatch << " | "
      << (e.graphs ? "on" : "off") << " | " << format_bytes(e.weight_bytes) << " | " << format_bytes(e.kv_bytes)
      << " (ctx " << e.ctx_size << ") | " << (offload ? offloaded_cell(c) + " | " : "")
      << (c.peak_vram_bytes ? format_bytes(c.peak_vram_bytes) : "-") << " | "
      << format_bytes(c.host_peak_rss_bytes) << " | " << (c.loaded ? format_num(c.load_ms) : "reused") << " |\n";
  }

  if (any_error) {
    o << "\n| # | configuration | error |\n|--:|---|---|\n";
    for (const ConfigResult& c : r.configs) {
      const std::string lbl = md_escape(c.config.label());
      if (!c.error.empty()) o << "| " << c.config.index << " | " << lbl << " | " << md_escape(c.error) << " |\n";
      for (const PrefillCell& p : c.prefill)
        if (!p.error.empty())
          o << "| " << c.config.index << " | " << lbl << ", TTFT pp" << p.prompt << " | " << md_escape(p.error) << " |\n";
      for (const DecodeCell& d : c.decode)
        if (!d.error.empty())
          o << "| " << c.config.index << " | " << lbl << ", decode @ d" << d.ctx << " | " << md_escape(d.error) << " |\n";
    }
  }
  o << "\npeak VRAM " << (r.peak_vram_bytes ? format_bytes(r.peak_vram_bytes) : "-") << " | host peak RSS "
    << format_bytes(r.host_peak_rss_bytes) << " | " << format_num(r.total_s) << " s\n";
  return o.str();
}

}  // namespace nf4flash
