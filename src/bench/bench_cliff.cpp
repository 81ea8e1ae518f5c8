// The offload cliff of a bench run (see bench_cliff.h): cell selection and the Markdown table.
#include "bench/bench_cliff.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "bench/bench_report.h"
#include "core/error.h"
#include "runtime/placement.h"

namespace nf4flash {

double weights_offloaded_fraction(const ConfigResult& c) {
  if (!c.has_report) return std::numeric_limits<double>::quiet_NaN();
  if (c.config.gpu_layers == 0) return 1.0;
  if (c.report.weight_bytes == 0) return 0.0;
  return static_cast<double>(c.report.offloaded_bytes) / static_cast<double>(c.report.weight_bytes);
}

bool config_offloaded(const ConfigResult& c) {
  return c.has_report && (!c.report.offload_device.empty() || c.config.gpu_layers == 0);
}

bool bench_shows_offload(const BenchResult& r) {
  if (r.spec.gpu_layers.size() > 1) return true;
  for (const ConfigResult& c : r.configs)
    if (config_offloaded(c)) return true;
  return false;
}

std::string config_gpu_layers_cell(const ConfigResult& c) {
  if (c.has_report && c.report.n_layers > 0) return cat(c.report.gpu_layers, "/", c.report.n_layers);
  return gpu_layers_name(c.config.gpu_layers);
}

std::string BenchCliff::row_label(size_t row) const {
  const int g = gpu_layers[row];
  int n = 0, placed = -1;
  bool same = true;
  for (const CliffCell& cell : cells[row]) {
    if (!cell.config || cell.config->report.n_layers <= 0) continue;
    const EngineReport& e = cell.config->report;
    n = e.n_layers;
    if (placed >= 0 && placed != e.gpu_layers) same = false;
    placed = e.gpu_layers;
  }
  if (g >= 0) return n > 0 ? cat(g, "/", n) : std::to_string(g);
  if (n > 0 && placed >= 0 && same) return cat(gpu_layers_name(g), " (", placed, "/", n, ")");
  return gpu_layers_name(g);
}

BenchCliff bench_cliff(const BenchResult& r) {
  const BenchSpec& s = r.spec;
  BenchCliff cl;
  cl.prompt = s.prompts.empty() ? 0 : s.prompts.front();
  cl.depth = s.ctxs.empty() ? cl.prompt : s.ctxs.front();
  cl.gpu_layers = s.gpu_layers;
  for (QuantChoice q : s.quants) {
    const bool dq = s.double_quant && q != QuantChoice::None;
    cl.quants.push_back({q, dq, cat(quant_choice_name(q), dq ? " dq" : "")});
  }
  for (int g : cl.gpu_layers) {
    std::vector<CliffCell> row;
    for (const CliffQuant& q : cl.quants) {
      CliffCell cell;
      for (const ConfigResult& c : r.configs) {
        const BenchConfig& k = c.config;
        if (k.quant != q.quant || k.gpu_layers != g || !k.use_cache || !c.error.empty() || !c.has_report) continue;
        cell.config = &c;
        cell.offloaded = weights_offloaded_fraction(c);
        for (const PrefillCell& p : c.prefill)
          if (p.prompt == cl.prompt) {
            cell.prefill = &p;
            break;
          }
        for (const DecodeCell& d : c.decode)
          if (d.ctx == cl.depth) {
            cell.decode = &d;
            break;
          }
        break;
      }
      row.push_back(cell);
    }
    cl.cells.push_back(std::move(row));
  }
  return cl;
}

namespace {

std::string percent(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", 100.0 * f);
  return b;
}

}  // namespace

std::string bench_cliff_markdown(const BenchResult& r) {
  if (!bench_shows_offload(r)) return "";
  const BenchCliff cl = bench_cliff(r);
  std::ostringstream o;
  const int tokens = std::max(0, r.spec.n_gen - 1);
  o << "\nOffload cliff";
  if (r.spec.base.max_vram > 0) o << " (--max-vram " << format_bytes(r.spec.base.max_vram) << ")";
  o << ": decode tok/s (tg" << tokens << " @ d" << cl.depth << ") and TTFT ms (pp" << cl.prompt
    << "), median, of the first cache-on configuration of each quant and GPU layers value that ran; "
       "% offloaded = weight bytes on the CPU backend / all weight bytes.\n\n";
  o << "| GPU layers |";
  for (const CliffQuant& q : cl.quants)
    o << " " << q.name << ": % offloaded | " << q.name << ": decode tok/s | " << q.name << ": TTFT ms |";
  o << "\n|---|";
  for (size_t i = 0; i < cl.quants.size(); ++i) o << "--:|--:|--:|";
  o << "\n";
  for (size_t row = 0; row < cl.gpu_layers.size(); ++row) {
    o << "| " << cl.row_label(row) << " |";
    for (const CliffCell& cell : cl.cells[row]) {
      if (!cell.config) {
        o << " error | error | error |";
        continue;
      }
      o << " " << (std::isnan(cell.offloaded) ? "-" : percent(cell.offloaded)) << " | ";
      if (cell.decode && !cell.decode->error.empty()) o << "error";
      else if (!cell.decode || cell.decode->tok_s.runs.empty()) o << "-";
      else o << format_num(cell.decode->tok_s.median);
      o << " | ";
      if (cell.prefill && !cell.prefill->error.empty()) o << "error";
      else if (!cell.prefill || cell.prefill->ttft_ms.runs.empty()) o << "-";
      else o << format_num(cell.prefill->ttft_ms.median);
      o << " |";
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace nf4flash
