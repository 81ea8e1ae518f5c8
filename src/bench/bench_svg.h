// SVG chart of a bench run, hand-written (no dependencies): two panels side by side,
//   left:  TTFT (ms, median; whiskers min-max) vs prompt length,
//   right: decode tokens/s (median; whiskers min-max) vs context depth,
// one series per configuration that ran (<g class="series" data-config="K">, a polyline and a
// marker per point, cache-off configurations dashed), log2 x axes when the values span more than
// 4x, and a legend naming every configuration (error rows marked, without a series).
// Over more than one --gpu-layers value, the offload cliff below (<g class="cliff">): two more
// panels, decode tok/s and TTFT against the percentage of the weights offloaded to the CPU, one
// series per quant (<g class="cliff-series" data-quant="nf4 dq">), log10 y axes when the values span
// more than 20x, and a legend of the quants.
#pragma once
#include <string>

#include "bench/bench_runner.h"

namespace nf4flash {

// title: drawn at the top (e.g. "preset llama3-8b on NVIDIA H200, commit abc1234").
std::string bench_svg(const BenchResult& r, const std::string& title);

// Escapes &, <, >, " and ' for XML text and attribute values.
std::string xml_escape(const std::string& s);

}  // namespace nf4flash
