// nf4flash doctor: what hardware is there, which paths will actually run for a model and flags,
// whether it fits, and a warning for every pitfall of the seed article (cache off, compute dtype
// not matching the weights, CPU while a GPU exists, an unavailable kernel asked for, TF32 off for
// f32 compute, dense weights that would fit as 4-bit), each with the flag that fixes it.
// Exit 0 when nothing is wrong, 1 when a warning was printed. --json for scripts.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/device_info.h"
#include "bench/bench_report.h"
#include "bench/presets.h"
#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/hf_config.h"
#include "model/tp_layout.h"
#include "model_flags.h"
#include "runtime/env_settings.h"
#include "runtime/placement.h"
#include "runtime/plan.h"
#include "doctor_placement.h"

namespace nf4flash::cli {
namespace {

using nlohmann::json;

struct DoctorArgs {
  ModelFlags model;
  std::string preset;
  bool json = false, load = false, no_load = false;
};

struct Finding {
  std::string level;  // "warning" | "info"
  std::string code, message, fix;
};

std::string lower_dtype(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    default: {
      std::string s(dtype_name(t));
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    }
  }
}

struct Estimate {
  size_t weight_bytes = 0, dense_weight_bytes = 0, nf4_weight_bytes = 0;
  size_t kv_per_token = 0, workspace_bytes = 0;
};

// The most kv heads a rank of `tp` holds (model/tp_layout.h: a rank keeps the kv heads its q heads
// read, replicated where several ranks read one).
int64_t kv_heads_a_rank(const ModelConfig& c, int tp) {
  int64_t most = 0;
  for (int r = 0; r < tp; ++r) most = std::max(most, tp_kv_heads(c, tp_range(c.n_heads, r, tp)).n);
  return most;
}

// Of a model sharded over tp ranks (model/tp_layout.h), what one rank holds: the layers', the
// embedding's and the head's weights split by heads, rows and vocabulary (a tied table's rows are
// the rank's head too), the final norm replicated.
size_t rank_weights(const ModelBytes& m, int tp) {
  if (tp <= 1) return m.weights();
  size_t layers = 0;
  for (size_t b : m.layer) layers += b;
  return m.final_norm + (m.embed + m.head + layers) / size_t(tp);
}

// The plan's sizes (a rank's under tensor parallel), and the weights' as dense and as NF4 with
// double quantization.
Estimate estimate(const ModelConfig& c, const Plan& p, const LoadOptions& o) {
  const ModelBytes m = model_bytes(c, p, o);
  Plan dense = p, nf4 = p;
  dense.quant = QuantType::None;
  nf4.quant = QuantType::NF4;
  nf4.double_quant = true;
  LoadOptions o64 = o;
  o64.blocksize = 64;
  o64.quant_lm_head = false;
  Estimate e;
  e.weight_bytes = rank_weights(m, o.tp);
  e.dense_weight_bytes = rank_weights(model_bytes(c, dense, o), o.tp);
  e.nf4_weight_bytes = rank_weights(model_bytes(c, nf4, o64), o.tp);
  e.kv_per_token = m.kv_token_layer * size_t(c.n_layers);
  if (o.tp > 1) e.kv_per_token = e.kv_per_token / size_t(c.n_kv_heads) * size_t(kv_heads_a_rank(c, o.tp));
  e.workspace_bytes = m.workspace;
  return e;
}

class Doctor {
 public:
  explicit Doctor(const DoctorArgs& a) : a_(a) {}

  int run() {
    gather_hardware();
    if (!a_.model.model.empty() || !a_.preset.empty()) check_model();
    int warnings = 0;
    for (const Finding& f : findings_) warnings += f.level == "warning";
    out_["ok"] = warnings == 0;
    out_["warnings"] = warnings;
    out_["findings"] = json::array();
    for (const Finding& f : findings_)
      out_["findings"].push_back({{"level", f.level}, {"code", f.code}, {"message", f.message}, {"fix", f.fix}});
    if (a_.json) std::printf("%s\n", out_.dump(2).c_str());
    else print_text(warnings);
    return warnings == 0 ? 0 : 1;
  }

 private:
  void warn(std::string code, std::string msg, std::string fix) {
    findings_.push_back({"warning", std::move(code), std::move(msg), std::move(fix)});
  }
  void info(std::string code, std::string msg, std::string fix) {
    findings_.push_back({"info", std::move(code), std::move(msg), std::move(fix)});
  }

  void gather_hardware() {
    gpus_ = query_gpus();
    host_ = query_host();
    out_["version"] = NF4FLASH_VERSION;
    out_["cuda_build"] = built_with_cuda();
    out_["gpu_absent_reason"] = gpus_.empty() ? gpu_absent_reason() : "";
    out_["host"] = host_to_json(host_);
    out_["gpus"] = json::array();
    for (const GpuInfo& g : gpus_) out_["gpus"].push_back(gpu_to_json(g));
    // the NF4FLASH_* settings in effect (runtime/env_settings.h): each one set changes a path
    out_["settings"] = json::object();
    for (const EnvSetting& s : env_settings())
      if (const char* v = std::getenv(s.name); v && *v) out_["settings"][s.name] = v;
    if (!out_["settings"].empty())
      info("settings", cat(out_["settings"].size(), " NF4FLASH_* setting(s) in the environment change the defaults"),
           "unset them to measure the default paths");
    if (!built_with_cuda() && (std::filesystem::exists("/proc/driver/nvidia/version") || std::filesystem::exists("/dev/nvidia0")))
      warn("gpu_unused_build", "an NVIDIA GPU is present but this nf4flash was built without CUDA",
           "rebuild with -DNF4FLASH_CUDA=ON (nvcc on PATH)");
  }

  void check_model() {
    const LoadOptions o = a_.model.to_options();
    ModelConfig cfg;
    std::string name;
    try {
      if (!a_.preset.empty()) {
        if (!a_.model.model.empty()) fail("doctor: give --model or --preset, not both");
        cfg = preset_config(a_.preset);
        name = "preset:" + a_.preset;
      } else {
        if (!std::filesystem::is_directory(a_.model.model)) fail("--model ", a_.model.model, ": not a directory");
        cfg = load_model_config(a_.model.model);
        name = a_.model.model;
      }
    } catch (const Error& e) {
      warn("model_unreadable", e.what(), a_.preset.empty() ? "--model DIR with a config.json" : "--preset NAME");
      return;
    }
    const CheckpointQuant cq = [&] {
      try {
        return checkpoint_quant(cfg);
      } catch (const Error&) {
        return CheckpointQuant{};
      }
    }();
    out_["model"] = {{"source", a_.preset.empty() ? "folder" : "preset"},
                     {"name", name},
                     {"architecture", cfg.architecture},
                     {"layers", cfg.n_layers},
                     {"hidden", cfg.hidden_size},
                     {"intermediate", cfg.intermediate_size},
                     {"heads", cfg.n_heads},
                     {"kv_heads", cfg.n_kv_heads},
                     {"head_dim", cfg.head_dim},
                     {"vocab", cfg.vocab_size},
                     {"max_positions", cfg.max_positions},
                     {"weights_dtype", lower_dtype(cfg.weights_dtype)},
                     {"prequantized", cq.present}};

    Plan plan;
    try {
      plan = make_plan(o, cfg);
    } catch (const Error& e) {
      const std::string m = e.what();
      std::string fix = "change the flag named in the message";
      if (m.rfind("--device cuda", 0) == 0) fix = "--device cpu (or run on a machine with a CUDA GPU and a CUDA build)";
      else if (m.rfind("--double-quant", 0) == 0) fix = "--quant nf4 (or drop --double-quant)";
      else if (m.rfind("--tf32", 0) == 0) fix = "--compute-dtype f32 (or drop --tf32)";
      else if (m.rfind("--quant", 0) == 0) fix = "omit --quant";
      warn("unavailable_option", m, fix);
      return;
    }
    const bool gpu = plan.device == Device::CUDA;
    const GpuInfo* g = gpu && !gpus_.empty() ? &gpus_.front() : nullptr;

    // the backend alone (cheap) answers whether the attention path exists
    std::unique_ptr<Backend> be;
    try {
      be = gpu ? make_cuda_backend({plan.compute, 0, o.tf32, std::nullopt}) : make_cpu_backend({plan.compute, o.threads});
    } catch (const Error& e) {
      const std::string m = e.what();
      const DType w = cq.present && cq.compute != DType::F32 ? cq.compute : cfg.weights_dtype;
      std::string fix = gpu ? "--device cpu" : "";
      if (m.find("--compute-dtype") != std::string::npos)  // e.g. f16 on the CPU: the weights' own dtype fixes it
        fix = cat("--compute-dtype ", w == DType::BF16 || w == DType::F16 ? lower_dtype(w) : std::string("f32"));
      warn("backend_unavailable", m, fix);
      return;
    }
    const std::string attn_why = be->attn_unsupported_reason(plan.attn, cfg.head_dim);
    if (!attn_why.empty())
      warn("attn_unavailable", attn_why, gpu ? "--attn sdpa (or auto)" : "--attn eager (or auto), or --device cuda");

    Estimate est = estimate(cfg, plan, o);
    if (o.tp > 1)
      info("tensor_parallel",
           cat("--tp ", o.tp, ": each rank holds ~", format_bytes(est.weight_bytes), " of weights and ",
               format_bytes(est.kv_per_token), " of KV cache a token; the memory line is one rank's"),
           "each rank's device needs that much free");
    size_t free_b = 0, total_b = 0;
    if (gpu) {
      gpu_memory(0, &free_b, &total_b);
    } else {
      free_b = host_.mem_available_bytes;
      total_b = host_.mem_total_bytes;
    }
    const bool dense_fits = est.dense_weight_bytes + est.workspace_bytes < free_b;
    const bool weights_fit = free_b == 0 || est.weight_bytes + est.workspace_bytes < free_b;
    const size_t small = size_t{2} << 30;
    const bool do_load = attn_why.empty() && weights_fit && !a_.no_load && (a_.load || est.weight_bytes <= small);

    json plan_j = {{"device", gpu ? "cuda" : "cpu"},
                   {"backend", be->name()},
                   {"compute_dtype", lower_dtype(plan.compute)},
                   {"quant", std::string(quant_type_name(plan.quant))},
                   {"double_quant", plan.double_quant},
                   {"prequantized", plan.prequantized},
                   {"attn", gpu ? std::string(attn_impl_name(plan.attn == AttnImpl::Auto ? AttnImpl::Flash : plan.attn))
                                : std::string("cpu-eager")},
                   {"linear_decode", "(not loaded: pass --load for the exact kernel)"},
                   {"linear_prefill", "(not loaded: pass --load for the exact kernel)"},
                   {"use_cache", o.use_cache},
                   {"graphs", o.graphs && be->graphs_supported()},
                   {"decode_pipelined", resolve_decode_pipeline(*be)},
                   {"tf32", o.tf32},
                   {"loaded", false}};
    int64_t ctx = o.ctx_size > 0 ? o.ctx_size : cfg.max_positions;
    size_t weight_bytes = est.weight_bytes, kv_bytes = 0;
    bool estimated = true;
    if (o.ctx_size <= 0 && free_b > est.weight_bytes && est.kv_per_token > 0)  // the engine caps ctx by free memory
      ctx = std::min<int64_t>(ctx, static_cast<int64_t>((free_b - est.weight_bytes) * 0.8 / est.kv_per_token));
    kv_bytes = static_cast<size_t>(std::max<int64_t>(ctx, 0)) * est.kv_per_token;
    be.reset();

    std::string tok_file;
    bool tok_present = false;
    if (do_load) {
      try {
        LoadOptions lo = o;
        auto eng = a_.preset.empty() ? Engine::load(lo) : Engine::load_preset(a_.preset, lo);
        const EngineReport& r = eng->report();
        plan_j["backend"] = r.backend;
        plan_j["attn"] = r.attn;
        plan_j["linear_decode"] = r.linear_decode;
        plan_j["linear_prefill"] = r.linear_prefill;
        plan_j["graphs"] = r.graphs;
        plan_j["decode_pipelined"] = r.decode_pipelined;
        plan_j["loaded"] = true;
        plan_j["load_ms"] = r.load_ms;
        weight_bytes = r.weight_bytes;
        kv_bytes = r.kv_bytes;
        ctx = r.ctx_size;
        estimated = false;
        tok_present = eng->tokenizer() != nullptr;
      } catch (const Error& e) {
        warn("load_failed", e.what(), "change the flag named in the message");
      } catch (const std::bad_alloc&) {
        warn("load_failed", "out of host memory while loading", "--quant nf4, or a smaller --ctx-size");
      }
    }
    if (!tok_present && a_.preset.empty() && std::filesystem::exists(a_.model.model + "/tokenizer.json"))
      tok_present = true;
    if (tok_present) tok_file = a_.model.model + "/tokenizer.json";
    out_["plan"] = plan_j;

    const size_t needed = weight_bytes + kv_bytes + est.workspace_bytes;
    const bool fits = free_b == 0 || needed <= free_b || !estimated;
    // the paged KV pool of `serve` / `batch` (BatchRunner): the memory left after the weights and the
    // workspace, less its 1 GiB reserve, in tokens (0: unknown or none)
    const size_t reserve = (size_t(1) << 30) + weight_bytes + est.workspace_bytes;
    const int64_t pool_tokens =
        gpu && free_b > reserve && est.kv_per_token ? static_cast<int64_t>((free_b - reserve) / est.kv_per_token) : 0;
    out_["memory"] = {{"where", gpu ? "gpu" : "host"},
                      {"tp", o.tp},  // > 1: one rank's share of what follows
                      {"free_bytes", free_b},
                      {"total_bytes", total_b},
                      {"weight_bytes", weight_bytes},
                      {"weights_estimated", estimated},
                      {"kv_bytes", kv_bytes},
                      {"kv_bytes_per_token", est.kv_per_token},
                      {"ctx", ctx},
                      {"workspace_bytes_estimate", est.workspace_bytes},
                      {"needed_bytes", needed},
                      {"fits", fits},
                      {"batch_pool_tokens", pool_tokens}};
    const int tthreads = o.threads > 0 ? o.threads : num_threads();
    out_["tokenizer"] = {{"present", tok_present}, {"file", tok_file}, {"threads", tthreads}};

    // ---- the pitfalls, each with its fix ----
    const char* where = gpu ? "VRAM" : "host RAM";
    if (gpu) {
      // the split of the layers (every one by default), its predicted speed, and what to do when
      // layers run on the CPU or do not fit
      const PlacementCheck pc = check_placement(o, cfg, plan, free_b, ctx, !a_.no_load);
      out_["placement"] = pc.j;
      placement_text_ = pc.summary;
      if (pc.error.empty() && pc.j.contains("gpu_bytes")) {  // the placed model fits by construction
        json& mem = out_["memory"];
        mem["needed_bytes"] = pc.j["gpu_bytes"];
        mem["fits"] = true;
        if (pc.j["gpu_layers"].get<int>() < cfg.n_layers) {
          // offloaded: the planned context, its KV cache on both sides, no pipelining, no batch pool estimate
          mem["ctx"] = pc.j["ctx"];
          mem["kv_bytes"] = pc.j["gpu_kv_bytes"].get<size_t>() + pc.j["cpu_kv_bytes"].get<size_t>();
          mem["batch_pool_tokens"] = 0;
          out_["plan"]["decode_pipelined"] = false;
        }
      }
      if (!pc.warning.empty()) warn(pc.error.empty() ? "layers_offloaded" : "does_not_fit", pc.warning, pc.fix);
    } else if (weights_fit && !a_.no_load) {
      const PlacementCheck pc = predict_cpu(o, cfg, plan);
      out_["placement"] = pc.j;
      placement_text_ = pc.summary;
    }
    if (!gpu && !weights_fit) {
      const std::string fix = plan.quant == QuantType::None && est.nf4_weight_bytes + est.workspace_bytes < free_b
                                  ? "--quant nf4 --double-quant"
                                  : "a machine with more memory";
      warn("does_not_fit", cat("the weights need ", format_bytes(est.weight_bytes), " but only ", format_bytes(free_b),
                               " of ", where, " is free"), fix);
    } else if (!gpu && o.ctx_size > 0 && !fits) {
      const int64_t max_ctx = est.kv_per_token ? static_cast<int64_t>((free_b - weight_bytes - est.workspace_bytes) * 0.8 / est.kv_per_token) : 0;
      warn("kv_does_not_fit", cat("weights ", format_bytes(weight_bytes), " + KV cache ", format_bytes(kv_bytes), " at ctx ",
                                  o.ctx_size, " exceed the ", format_bytes(free_b), " of free ", where),
           cat("--ctx-size ", std::max<int64_t>(max_ctx, 1), plan.quant == QuantType::None ? " or --quant nf4" : ""));
    }
    if (!o.use_cache)
      warn("cache_disabled", "the KV cache is off (--no-cache): every token recomputes the whole context", "drop --no-cache");
    const DType want = cq.present && cq.compute != DType::F32 ? cq.compute : cfg.weights_dtype;
    const bool half = [](DType t) { return t == DType::BF16 || t == DType::F16; }(want);
    if (half && (plan.compute == DType::BF16 || plan.compute == DType::F16) && plan.compute != want)
      warn("dtype_mismatch",
           cat(cq.present ? "the checkpoint's bnb_4bit_compute_dtype is " : "the weights are ", lower_dtype(want),
               " but compute is ", lower_dtype(plan.compute), ": every op casts",
               want == DType::BF16 ? " and f16 overflows above 65504" : " and loses precision"),
           cat("--compute-dtype ", lower_dtype(want)));
    if (!gpu && !gpus_.empty())
      warn("cpu_with_gpu", cat("the model runs on the CPU while ", gpus_.front().name, " is available"), "--device cuda");
    if (gpu && plan.compute == DType::F32 && !o.tf32 && g && g->tf32)
      warn("tf32_off", "f32 compute on a GPU with TF32 tensor cores, but TF32 is off", "--tf32 on");
    if (tthreads == 1 && host_.logical_cores > 1)
      warn("single_thread", cat("tokenizer and CPU work run on 1 thread of ", host_.logical_cores), "--threads 0");
    if (gpu && plan.quant == QuantType::None && weights_fit)
      info("dense_on_gpu",
           cat("weights are dense ", lower_dtype(plan.compute), " (", format_bytes(est.dense_weight_bytes),
               "); as 4-bit they would take about ", format_bytes(est.nf4_weight_bytes),
               " and decode would read less memory per token"),
           "--quant nf4 --double-quant");
    if (gpu && !o.graphs) info("graphs_off", "decode launches kernel by kernel (no CUDA graph)", "drop --no-graphs");
    if (gpu && plan.attn == AttnImpl::Eager && attn_why.empty())
      info("eager_attn", "eager attention is the slow path (scores materialized)", "--attn flash or --attn sdpa");
    if (!dense_fits && plan.quant != QuantType::None && weights_fit)
      info("quant_needed", "4-bit weights are what makes this model fit", "");
  }

  void print_text(int warnings) const {
    std::printf("nf4flash doctor %s (%s)\n", NF4FLASH_VERSION, built_with_cuda() ? "CUDA build" : "CPU-only build");
    std::printf("GPUs\n");
    if (gpus_.empty()) std::printf("  none: %s\n", out_.value("gpu_absent_reason", std::string()).c_str());
    for (const GpuInfo& g : gpus_)
      std::printf("  %d: %s | compute %d.%d, %d SMs | %s free of %s | driver %s (CUDA %s), runtime %s | bf16 %s, tf32 %s\n",
                  g.index, g.name.c_str(), g.cc_major, g.cc_minor, g.sm_count, format_bytes(g.free_bytes).c_str(),
                  format_bytes(g.total_bytes).c_str(), g.driver_version.empty() ? "?" : g.driver_version.c_str(),
                  g.driver_cuda_version.c_str(), g.runtime_version.c_str(), g.bf16 ? "yes" : "no", g.tf32 ? "yes" : "no");
    std::printf("settings\n");
    if (out_["settings"].empty()) std::printf("  defaults (no NF4FLASH_* setting in the environment)\n");
    for (const auto& [k, v] : out_["settings"].items()) std::printf("  %s=%s\n", k.c_str(), v.get<std::string>().c_str());
    std::printf("host\n  %s | %d threads | %s | RAM %s, %s available | %s\n", host_.cpu_model.c_str(), host_.logical_cores,
                host_.simd.c_str(), format_bytes(host_.mem_total_bytes).c_str(),
                format_bytes(host_.mem_available_bytes).c_str(), host_.os.c_str());
    if (out_.contains("model")) {
      const json& m = out_["model"];
      std::printf("model: %s\n  %s | %d layers, hidden %lld, %d heads / %d kv heads, head_dim %d, vocab %lld, max ctx %lld | %s weights%s\n",
                  m["name"].get<std::string>().c_str(), m["architecture"].get<std::string>().c_str(), m["layers"].get<int>(),
                  static_cast<long long>(m["hidden"].get<int64_t>()), m["heads"].get<int>(), m["kv_heads"].get<int>(),
                  m["head_dim"].get<int>(), static_cast<long long>(m["vocab"].get<int64_t>()),
                  static_cast<long long>(m["max_positions"].get<int64_t>()), m["weights_dtype"].get<std::string>().c_str(),
                  m["prequantized"].get<bool>() ? " (bitsandbytes 4-bit checkpoint)" : "");
    }
    if (out_.contains("plan")) {
      const json& p = out_["plan"];
      const json& mem = out_["memory"];
      const json& t = out_["tokenizer"];
      if (p["loaded"].get<bool>())
        std::printf("will run (loaded in %.0f ms)\n", p["load_ms"].get<double>());
      else
        std::printf("will run (plan only, not loaded)\n");
      std::printf("  device     %s: %s\n", p["device"].get<std::string>().c_str(), p["backend"].get<std::string>().c_str());
      std::printf("  compute    %s%s\n", p["compute_dtype"].get<std::string>().c_str(), p["tf32"].get<bool>() ? " (tf32 on)" : "");
      std::printf("  quant      %s%s%s\n", p["quant"].get<std::string>().c_str(), p["double_quant"].get<bool>() ? " + double quant" : "",
                  p["prequantized"].get<bool>() ? " (from the checkpoint)" : "");
      std::printf("  attention  %s\n", p["attn"].get<std::string>().c_str());
      std::printf("  linear     decode: %s | prefill: %s\n", p["linear_decode"].get<std::string>().c_str(),
                  p["linear_prefill"].get<std::string>().c_str());
      std::printf("  kv cache   %s, %s at ctx %lld (%s/token)\n", p["use_cache"].get<bool>() ? "on" : "OFF",
                  format_bytes(mem["kv_bytes"].get<size_t>()).c_str(), static_cast<long long>(mem["ctx"].get<int64_t>()),
                  format_bytes(mem["kv_bytes_per_token"].get<size_t>()).c_str());
      if (mem["batch_pool_tokens"].get<int64_t>() > 0)
        std::printf("  batching   the paged KV pool of serve/batch holds ~%lld tokens (%lld sequences at ctx %lld)\n",
                    static_cast<long long>(mem["batch_pool_tokens"].get<int64_t>()),
                    static_cast<long long>(mem["batch_pool_tokens"].get<int64_t>() / std::max<int64_t>(1, mem["ctx"].get<int64_t>())),
                    static_cast<long long>(mem["ctx"].get<int64_t>()));
      std::printf("  graphs     %s\n", p["graphs"].get<bool>() ? "on" : "off");
      std::printf("  decode     %s\n", p["decode_pipelined"].get<bool>()
                                          ? "pipelined (each step queued before the host has the token it consumes)"
                                          : "one step per host round trip");
      std::printf("  memory     weights %s%s + KV %s + workspace ~%s = %s of %s free %s: %s\n",
                  mem["weights_estimated"].get<bool>() ? "~" : "", format_bytes(mem["weight_bytes"].get<size_t>()).c_str(),
                  format_bytes(mem["kv_bytes"].get<size_t>()).c_str(),
                  format_bytes(mem["workspace_bytes_estimate"].get<size_t>()).c_str(),
                  format_bytes(mem["needed_bytes"].get<size_t>()).c_str(), format_bytes(mem["free_bytes"].get<size_t>()).c_str(),
                  mem["where"] == "gpu" ? "VRAM" : "host RAM", mem["fits"].get<bool>() ? "fits" : "DOES NOT FIT");
      std::printf("%s", placement_text_.c_str());
      if (t["present"].get<bool>())
        std::printf("  tokenizer  %s, encodes on %d threads\n", t["file"].get<std::string>().c_str(), t["threads"].get<int>());
      else
        std::printf("  tokenizer  none (token ids only), %d threads\n", t["threads"].get<int>());
    }
    for (const Finding& f : findings_)
      std::printf("%s: %s%s%s\n", f.level.c_str(), f.message.c_str(), f.fix.empty() ? "" : " -> fix: ", f.fix.c_str());
    if (warnings == 0) std::printf("ok: nothing wrong found\n");
    else std::printf("%d warning%s\n", warnings, warnings == 1 ? "" : "s");
  }

  const DoctorArgs& a_;
  std::vector<GpuInfo> gpus_;
  HostInfo host_;
  json out_ = json::object();
  std::string placement_text_;  // the placement lines of the plan (CUDA)
  std::vector<Finding> findings_;
};

NF4FLASH_COMMAND("doctor", "Show the hardware, the paths that will really run, and every configuration pitfall",
                 [](CLI::App& app) -> CommandRun {
                   auto a = std::make_shared<DoctorArgs>();
                   a->model.add(app, false);
                   app.add_option("--preset", a->preset,
                                  "check a synthetic preset instead of --model: " + preset_list());
                   app.add_flag("--json", a->json, "print one JSON object (ok, gpus, host, model, plan, memory, tokenizer, findings)");
                   auto* l = app.add_flag("--load", a->load,
                                          "always load the engine for the exact kernel names (default: only when the "
                                          "weights are under 2 GiB and fit)");
                   app.add_flag("--no-load", a->no_load, "never load or measure: resolve the plan and estimate sizes only (no predicted speed)")->excludes(l);
                   app.footer("\nExit status: 0 when nothing is wrong, 1 when a warning was printed (info lines do not count).");
                   return [a] { return Doctor(*a).run(); };
                 });

}  // namespace
}  // namespace nf4flash::cli
