// nf4flash-kernel-bench: what the benchmark's sections share. Each section times the kernels the
// CUDA backend runs by default, through the public Backend ops (decode_forms.cu and skinny_forms.cu
// alone launch other instantiations of the decode GEMV and the skinny GEMM, checked against the
// backend's output), and adds rows to a
// Report (a table on stdout, the rows of the JSON report). Timing (bench_util.cpp): an op is called
// once to warm up (lazy workspaces are allocated then, never inside a capture), then captured
// `reps` times in one CUDA graph with its weights rotated over enough copies that the working set
// is at least 4x the L2 (so they come from HBM, as in a decode step); the graph is replayed once,
// then `trials` replays are timed on the host clock around replay + synchronize, and the median
// per call is reported. Bytes are the least each op must move; GB/s is also given as a percentage
// of the device-to-device copy's (copy_reference.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "quant/quant4.h"

namespace nf4flash::kbench {

// The rows of one run: printed as they come, kept for the JSON report.
class Report {
 public:
  void set_copy_gb_per_s(double gbs) { copy_gbs_ = gbs; }
  // A titled block of the table; the rows after it carry `id` as their "section".
  void section(const std::string& id, const std::string& title);
  // One timed op: bytes > 0 gives GB/s and % of copy, flops > 0 gives TFLOP/s.
  void row(const std::string& name, double sec, double bytes, double flops, nlohmann::json extra = {});
  const nlohmann::json& rows() const { return rows_; }

 private:
  double copy_gbs_ = 0;
  std::string section_;
  nlohmann::json rows_ = nlohmann::json::array();
};

struct Context {
  Backend& be;                  // the default backend (the engine's tuning)
  CudaBackendOptions options;   // how `be` was made (device, compute dtype, tuning)
  cudaDeviceProp prop{};
  int reps = 50, trials = 9;
  std::mt19937_64 rng{1234};
  Report& report;

  // Copies of a `bytes` working set to rotate over so that they add up to >= 4x the L2 (at least 2).
  int copies_for(double bytes) const;
  // A second backend like `be` with `edit` applied to its tuning (the rows of a non-default path).
  std::unique_ptr<Backend> backend_with(const std::function<void(CudaTuning&)>& edit) const;
};

// Throws Error naming `what` and the CUDA error unless e is cudaSuccess.
void cuda_check(cudaError_t e, const char* what);

double median(std::vector<double> v);
// Median seconds per call of body(i), i = 0 .. reps-1, as the header describes.
double time_graph(Backend& be, const std::function<void(int)>& body, int reps, int trials);
// Median seconds of call() timed one call at a time (synchronize before and after; one warm-up):
// for ops that size their work on the host and so are not captured (prefill attention).
double time_calls(Backend& be, const std::function<void()>& call, int trials);

// Random NF4 weights (bitsandbytes layout: random code bytes, blocksize 64; absmax in f32, or with
// double quant as 8-bit codes with a nested table).
std::shared_ptr<const Quant4Tensor> random_q4(int64_t rows, int64_t cols, bool double_quant, std::mt19937_64& g);
// Host bits of n bf16 values in [-0.01, 0.01] (a cheap hash of the index: fast at hundreds of MB).
std::vector<uint16_t> bf16_pattern(size_t n, uint64_t seed);
// A dense [rows, cols] bf16 weight on be from host bits.
std::unique_ptr<Weight> upload_bf16(Backend& be, int64_t rows, int64_t cols, const std::vector<uint16_t>& bits);
// A backend buffer of n random normal bf16 values (activations), uploaded before it returns.
std::unique_ptr<Buffer> randn_bf16(Backend& be, size_t n, std::mt19937_64& g);

// The sections (one file each), in the order main runs them.
double copy_reference(Context& c);       // copy_reference.cpp: returns GB/s (read + write)
void decode_linears(Context& c);         // decode_linear.cpp
void decode_attention(Context& c);       // decode_attention.cpp
void prefill_linears(Context& c);        // prefill_linear.cpp
void prefill_attention(Context& c);      // prefill_attention.cpp
void moe_experts(Context& c);            // moe_experts.cpp
std::string decode_forms(Context& c);    // decode_forms.cu: the forms whose output differed ("" if none)
// skinny_forms.cu (builds that target 90, NF4FLASH_KBENCH_SKINNY_FORMS): the skinny GEMM's stage
// synchronization forms; the pairs whose outputs differed ("" if none)
std::string skinny_forms(Context& c);

}  // namespace nf4flash::kbench
