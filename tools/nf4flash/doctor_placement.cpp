#include "doctor_placement.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "backend/backend.h"
#include "bench/bench_report.h"
#include "core/error.h"
#include "runtime/placement.h"
#include "runtime/placement_probe.h"

namespace nf4flash::cli {
namespace {

using nlohmann::json;

// The prediction's workload: the reference benchmark's -p 512 and decode at context 512.
constexpr int64_t kPredictCtx = 512, kPredictPrompt = 512;

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

json rates_json(const BackendRates& r) {
  return {{"gemv_bytes_per_s", r.gemv_bytes_s},
          {"gemv_dense_bytes_per_s", r.gemv_dense_bytes_s},
          {"gemm_flop_per_s", r.gemm_flop_s},
          {"op_s", r.op_s},
          {"op_graph_s", r.op_graph_s}};
}

std::string rates_text(const char* who, const char* quant, const BackendRates& r) {
  return cat(who, " layer GEMV (", quant, ") ", fmt("%.0f", r.gemv_bytes_s / 1e9), " GB/s, dense GEMV ",
             fmt("%.0f", r.gemv_dense_bytes_s / 1e9), " GB/s, layer GEMM ", fmt("%.3g", r.gemm_flop_s / 1e12), " TFLOP/s");
}

json prediction_json(const PlacementPrediction& p) {
  return {{"ctx", kPredictCtx},   {"prompt", kPredictPrompt}, {"decode_tok_s", p.decode_tok_s()},
          {"decode_ms", p.decode_ms}, {"gpu_ms", p.gpu_ms},    {"cpu_ms", p.cpu_ms},
          {"hop_ms", p.hop_ms},       {"ttft_ms", p.ttft_ms}};
}

}  // namespace

PlacementCheck predict_cpu(const LoadOptions& o, const ModelConfig& cfg, const Plan& plan) {
  PlacementCheck pc;
  const ModelBytes m = model_bytes(cfg, plan, o);
  const Placement pl = place_layers(m, kPredictCtx, 0, 0, "");
  auto cpu = make_cpu_backend({plan.compute, o.threads});
  const BackendRates cr = probe_backend(*cpu, cfg, weight_policy(plan, o), kPredictPrompt);
  const double host_read = probe_host_read(o.threads);
  const PlacementPrediction p = predict_placement(pl, m, cfg, BackendRates{}, cr, TransferRate{}, kPredictCtx, kPredictPrompt, false);
  const char* qname = plan.quant == QuantType::None ? "dense" : plan.quant == QuantType::NF4 ? "nf4" : "fp4";
  pc.j = {{"n_layers", cfg.n_layers},
          {"gpu_layers", 0},
          {"predicted", prediction_json(p)},
          {"rates", {{"cpu", rates_json(cr)}, {"host_read_bytes_per_s", host_read}}}};
  pc.summary = cat("  predicted  decode ", fmt("%.1f", p.decode_tok_s()), " tok/s at ctx ", kPredictCtx, ", TTFT ",
                   fmt("%.0f", p.ttft_ms), " ms for ", kPredictPrompt, " tokens\n  measured   ", rates_text("CPU", qname, cr),
                   " | host memory read ", fmt("%.0f", host_read / 1e9), " GB/s\n");
  return pc;
}

PlacementCheck check_placement(const LoadOptions& o, const ModelConfig& cfg, const Plan& plan, size_t free_b,
                               int64_t unplaced_ctx, bool measure) {
  PlacementCheck pc;
  // the engine plans a placed model's KV cache for --ctx-size or min(model max, 8192); unplaced,
  // it sizes the cache itself (unplaced_ctx)
  const bool placing = o.gpu_layers != kAllLayers || o.max_vram > 0;
  const int64_t ctx = !placing ? unplaced_ctx
                      : o.ctx_size > 0 ? o.ctx_size
                                       : std::min<int64_t>(cfg.max_positions, kPlacedDefaultCtx);
  const size_t budget = o.max_vram > 0 ? o.max_vram : free_b > kFreeMemoryMargin ? free_b - kFreeMemoryMargin : 1;
  const std::string btext = o.max_vram > 0 ? cat("--max-vram ", format_bytes(o.max_vram))
                                           : cat("the GPU's free memory less 1 GiB (", format_bytes(budget), ")");
  const ModelBytes m = model_bytes(cfg, plan, o);
  std::optional<Placement> pl;
  try {
    pl = place_layers(m, ctx, o.gpu_layers, budget, btext);
  } catch (const Error& e) {
    pc.error = e.what();
    try {  // what auto would do instead
      pl = place_layers(m, ctx, kAutoLayers, budget, btext);
    } catch (const Error&) {
    }
  }

  std::unique_ptr<Backend> gpu;
  BackendRates gr, cr;
  TransferRate link;
  if (measure) {
    gpu = make_cuda_backend({plan.compute, 0, o.tf32, std::nullopt});
    gr = probe_backend(*gpu, cfg, weight_policy(plan, o), kPredictPrompt);
  }
  const bool offloaded = pl && pl->offloaded();
  if (offloaded && measure) {
    Plan cp = plan;
    cp.device = Device::CPU;
    auto cpu = make_cpu_backend({plan.compute, o.threads});
    cr = probe_backend(*cpu, cfg, weight_policy(cp, o), kPredictPrompt);
    link = probe_transfer(*gpu, size_t(cfg.hidden_size) * 4 * kPredictPrompt);
  }
  const char* qname = plan.quant == QuantType::None ? "dense" : plan.quant == QuantType::NF4 ? "nf4" : "fp4";
  pc.j = {{"requested", gpu_layers_name(o.gpu_layers)},
          {"n_layers", cfg.n_layers},
          {"ctx", ctx},
          {"budget_bytes", budget},
          {"error", pc.error}};
  std::string measured;
  if (measure) {
    pc.j["rates"] = {{"gpu", rates_json(gr)}};
    measured = cat("  measured   ", rates_text("GPU", qname, gr));
  }
  if (offloaded && measure) {
    pc.j["rates"]["cpu"] = rates_json(cr);
    pc.j["rates"]["link"] = {{"bytes_per_s", link.bytes_s}, {"latency_s", link.latency_s}};
    const double host_read = probe_host_read(o.threads);
    pc.j["rates"]["host_read_bytes_per_s"] = host_read;
    measured += cat(" | ", rates_text("CPU", qname, cr), " | host memory read ", fmt("%.0f", host_read / 1e9),
                    " GB/s | host<->GPU ", fmt("%.1f", link.bytes_s / 1e9), " GB/s");
  }
  std::optional<PlacementPrediction> pred;
  if (!measured.empty()) measured += "\n";
  if (pl) {
    if (measure) {
      pred = predict_placement(*pl, m, cfg, gr, cr, link, kPredictCtx, kPredictPrompt, !offloaded && o.graphs);
      pc.j["predicted"] = prediction_json(*pred);
    }
    pc.j["gpu_layers"] = pl->gpu_layers;
    pc.j["gpu_bytes"] = pl->gpu_total();
    pc.j["gpu_fixed_bytes"] = pl->gpu_fixed;
    pc.j["gpu_weight_bytes"] = pl->gpu_weights;
    pc.j["gpu_kv_bytes"] = pl->gpu_kv;
    pc.j["cpu_weight_bytes"] = pl->cpu_weights;
    pc.j["cpu_kv_bytes"] = pl->cpu_kv;
    pc.summary = cat("  placement  ", pc.error.empty() ? "" : "(auto) ", describe_placement(*pl), "; GPU ",
                     format_bytes(pl->gpu_total()), " of ", btext, "\n");
    if (pred)
      pc.summary += cat("  predicted  decode ", fmt("%.1f", pred->decode_tok_s()), " tok/s at ctx ", kPredictCtx, " (GPU ",
                        fmt("%.2f", pred->gpu_ms), " ms",
                        offloaded ? cat(" + CPU ", fmt("%.1f", pred->cpu_ms), " ms + link ", fmt("%.2f", pred->hop_ms), " ms") : "",
                        " a token), TTFT ", fmt("%.0f", pred->ttft_ms), " ms for ", kPredictPrompt, " tokens\n");
    pc.summary += measured;
  } else {
    pc.summary = cat("  placement  ", pc.error, "\n", measured);
  }

  // 4-bit weights when dense ones do not all fit
  std::string alt;
  if (plan.quant == QuantType::None && (!pl || offloaded || !pc.error.empty())) {
    Plan q = plan;
    q.quant = QuantType::NF4;
    q.double_quant = true;
    LoadOptions oq = o;
    oq.blocksize = 64;
    const ModelBytes m4 = model_bytes(cfg, q, oq);
    try {
      const Placement p4 = place_layers(m4, ctx, kAllLayers, budget, btext);
      alt = cat("--quant nf4 --double-quant (fits all ", cfg.n_layers, " layers)");
      pc.j["nf4_alternative"] = {{"gpu_layers", p4.gpu_layers}};
      if (measure) {
        const BackendRates r4 = probe_backend(*gpu, cfg, weight_policy(q, oq), kPredictPrompt);
        const PlacementPrediction d4 = predict_placement(p4, m4, cfg, r4, cr, link, kPredictCtx, kPredictPrompt, o.graphs);
        alt = cat("--quant nf4 --double-quant (fits all ", cfg.n_layers, " layers: predicted ", fmt("%.0f", d4.decode_tok_s()),
                  " vs ", pred ? fmt("%.1f", pred->decode_tok_s()) : std::string("no"), " tok/s)");
        pc.j["nf4_alternative"] = {{"gpu_layers", p4.gpu_layers}, {"decode_tok_s", d4.decode_tok_s()}, {"ttft_ms", d4.ttft_ms}};
      }
    } catch (const Error&) {
    }
  }
  if (!pc.error.empty()) {
    pc.warning = pc.error;
    pc.fix = !alt.empty() ? alt
             : pl     ? cat("--gpu-layers auto (", pl->gpu_layers, " layers on the GPU",
                            pred ? cat(": predicted ", fmt("%.1f", pred->decode_tok_s()), " tok/s") : std::string(), ")")
                      : std::string("a smaller --ctx-size, --quant nf4, or a GPU with more memory");
  } else if (offloaded) {
    const int cpu_layers = pl->n_layers - pl->gpu_layers;
    pc.warning = cat(cpu_layers, " of ", pl->n_layers, " layers run on the CPU",
                     pred ? cat(": predicted decode ", fmt("%.1f", pred->decode_tok_s()), " tok/s, of which the CPU's layers take ",
                                fmt("%.0f", 100.0 * pred->cpu_ms / pred->decode_ms), "%")
                          : std::string(": every token waits for them"));
    pc.fix = !alt.empty() ? alt : "a smaller --ctx-size (its KV cache leaves room for more layers) or a GPU with more memory";
  }
  return pc;
}

}  // namespace nf4flash::cli
