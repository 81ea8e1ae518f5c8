// The offload cliff of a bench run over --gpu-layers values: for each value (a row, in the order
// given) and each --quant (a column group), the fraction of the weights on the CPU backend, decode
// tok/s at the first --ctx depth and TTFT at the first -p length, taken from the first cache-on
// configuration of that (quant, gpu_layers) pair that ran. The Markdown report prints it as a table
// after the main one; the SVG draws it as two panels against the fraction offloaded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_runner.h"

namespace nf4flash {

// Fraction of the resident weight bytes on the offload device (offloaded_bytes / weight_bytes); 1
// when gpu_layers 0 runs the whole model on the CPU backend; NaN without an engine report.
double weights_offloaded_fraction(const ConfigResult& c);
// The configuration runs layers on the CPU backend: some are offloaded, or gpu_layers 0 put all there.
bool config_offloaded(const ConfigResult& c);
// The Markdown report shows the GPU layers column and the cliff table: the gpu_layers list has more
// than one entry, or some configuration is offloaded.
bool bench_shows_offload(const BenchResult& r);
// The main table's GPU layers cell: "24/32" from the report, else the request ("24", "auto").
std::string config_gpu_layers_cell(const ConfigResult& c);

struct CliffCell {
  const ConfigResult* config = nullptr;  // the pair's first cache-on configuration that ran; null: none did
  double offloaded = 0;                  // weights_offloaded_fraction of `config`
  const PrefillCell* prefill = nullptr;  // at the first -p length (null: not measured)
  const DecodeCell* decode = nullptr;    // at the first --ctx depth (null: not measured)
};

struct CliffQuant {
  QuantChoice quant = QuantChoice::Auto;
  bool double_quant = false;
  std::string name;  // "none", "nf4 dq"
};

struct BenchCliff {
  int64_t prompt = 0;  // the first -p length
  int64_t depth = 0;   // the first --ctx depth (default: the first -p length)
  std::vector<int> gpu_layers;                // rows
  std::vector<CliffQuant> quants;             // column groups
  std::vector<std::vector<CliffCell>> cells;  // [row][quant]
  // "24/32"; "all"/"auto" with the layers they placed when every quant placed the same, e.g. "auto (28/32)"
  std::string row_label(size_t row) const;
};

BenchCliff bench_cliff(const BenchResult& r);

// The cliff table with its caption (a blank line first), or "" when bench_shows_offload is false.
std::string bench_cliff_markdown(const BenchResult& r);

}  // namespace nf4flash
