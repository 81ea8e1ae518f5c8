// Microbenchmark of the CUDA decode kernels (the `kernel-bench` subcommand): device-to-device copy
// bandwidth, the fused 4-bit GEMV on the Llama-3-8B MLP shapes (plain and double-quant absmax),
// the dense bf16 GEMV on the lm_head shape, split-K decode attention and the prefill attention
// kernels (flash, sdpa, eager; TFLOP/s), all in one run.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace nf4flash {

struct KernelBenchOptions {
  int reps = 50;      // kernels per timed graph replay
  int trials = 9;     // timed replays (median reported)
  int device = 0;
  bool attention_only = false;  // only the copy reference and the prefill attention kernels
  bool gemv_only = false;       // only the copy reference and the 4-bit GEMV rows (variants, fused)
  bool prefill_linear_only = false;  // only the copy reference and the prefill linear rows
  bool read_patterns_only = false;   // only the copy reference and the read-order rows ("read units")
  bool attn_decode_only = false;     // only the copy reference and decode attention over a ladder of
                                     // contexts (cache read from HBM), per kernel and split order
  // focused 4-bit GEMV rows (profiling): when set, only these [rows, cols] shapes (T = 1, nf4-dq and
  // nf4) with these variants (names as in the GEMV rows: "seq" = the default, "seq-<cfg>" = a
  // NF4FLASH_GEMV_SEQ_CFG configuration, "grouped" = the grouped tile layout, "ablate" = the
  // default kernel's speed-of-light ablations, nf4-dq only, wrong results), then return
  std::vector<std::pair<int64_t, int64_t>> gemv_shapes;
  std::vector<std::string> gemv_variants;
};

// Runs the benchmark, prints a table on stdout and returns the JSON report.
std::string cuda_kernel_bench(const KernelBenchOptions& o);

}  // namespace nf4flash
