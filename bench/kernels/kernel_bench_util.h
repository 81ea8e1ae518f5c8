// Helpers of kernel-bench shared by its rows (definitions in kernel_bench_util.cu).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "quant/quant4.h"

namespace nf4flash::kbench {

// Read-only streaming reference: every thread reads 16-byte words, 4 in flight, grid-stride.
// Shapes: src [n16] uint4; grid 4 blocks per SM x 256 threads; sink is written only if the xor of
// all words equals a value it cannot take (nothing is optimized out).
__global__ void read_only_kernel(const uint4* __restrict__ src, int64_t n16, uint4* sink);

double median(std::vector<double> v);
// Median seconds per call of `body` (called reps times per trial), timed via graph replays.
double time_graph(Backend& be, const std::function<void(int)>& body, int reps, int trials);
// The same for kernels launched directly, outside any backend: `launch(i, st)` enqueues launch i on
// st, a stream of its own; reps launches per captured graph, median over trials replays.
double time_stream_graph(const std::function<void(int, cudaStream_t)>& launch, int reps, int trials);
// Comma-separated integers from the environment variable `name` (atoi per item; empty when unset).
std::vector<int> env_int_list(const char* name);
// A [rows, cols] bf16 tensor view of host bits (for upload_dense).
TensorInfo bf16_tensor(const char* name, int64_t rows, int64_t cols, const std::vector<uint16_t>& bits);
// A dense [N, K] bf16 weight uploaded to be with values from a cheap hash of the element index
// first + i (|w| <= 0.01; fast to make at hundreds of MB).
std::unique_ptr<Weight> upload_bf16_pattern(Backend& be, const char* name, int64_t N, int64_t K, uint32_t first = 0);
// Device buffers: rope frequencies [hd/2] (f32, theta^(-2i/hd)); n random normal bf16 values.
std::unique_ptr<Buffer> upload_rope_freqs(Backend& be, int hd, float theta);
std::unique_ptr<Buffer> upload_randn_bf16(Backend& be, size_t n, std::mt19937& g);
// Random NF4 weights (random code bytes and absmax; double quant with a nested table when dq).
std::shared_ptr<Quant4Tensor> random_q4(int64_t rows, int64_t cols, bool dq, std::mt19937& g);
// One decode layer's nf4-dq weights (Llama-3-8B shapes) and the T = 1 activations of its chains.
struct LayerSet {
  std::unique_ptr<Weight> q, k, v, o, gate, up, down;
};
struct LayerActs {
  Act x, q, k, v, g, u, resid, tmp;
};
using ReportFn = std::function<void(const std::string&, double, double, nlohmann::json)>;
// One whole decode layer in the decoder's fused order at ctx 512, layers rotated over the sets:
// the attention in three launches / one / left out, and the GEMVs one launch each or chained
// (kernel_bench_layer.cu). layer_bytes: the layer's weight and activation bytes.
// wlabel names the weights in the rows; variants: of "unfused", "fused", "fused c1", "none",
// "unfused chain", "none chain", and the empty-launch ablations (cuda::EmptyLaunches, timing only)
// "attn empty" (the attention's three launches empty) and "all empty" (every launch of the layer).
void bench_decode_layer_full(Backend& be, std::vector<LayerSet>& sets, const LayerActs& a, double layer_bytes,
                             int reps, int trials, std::mt19937& g, const ReportFn& report,
                             const char* wlabel = "nf4-dq",
                             const std::vector<std::string>& variants = {"unfused", "fused", "fused c1", "none",
                                                                          "unfused chain", "none chain",
                                                                          "attn empty", "all empty"});
// A decode layer with bf16 weights (2 sets, from HBM): rows "gemv bf16 qkv|o+residual|gate+up+silu|
// down+residual ... T=1", "decode layer GEMVs bf16 T=1" and "decode layer full bf16 T=1 ctx=512 attn
// unfused|none" (kernel_bench_layer.cu); a: the nf4 rows' activations (Llama-3-8B shapes).
void bench_dense_layer(Backend& be, const LayerActs& a, int reps, int trials, std::mt19937& g, const ReportFn& report);
// Prefill attention kernels alone (flash / sdpa / eager), Llama-3-8B layer shape.
nlohmann::json bench_attention_prefill(Backend& be, int trials, std::mt19937& g);
// Decode attention rows (kernel_bench_attn.cu): at each context, Backend::attention per variant
// ("label:ENV=VAL,..."; "label" alone = the defaults), and with rope_rows the whole attention of a
// decode layer (rope + cache write + attention: fused / fused in plain blocks / unfused). rotate:
// the cache rotated over enough layers that K/V come from HBM (as in a decode step); else one
// layer (L2-resident across the repeats when it fits).
struct DecodeAttnBench {
  std::vector<int> ctxs;
  std::vector<std::string> variants;
  bool rotate = false;
  bool rope_rows = false;
};
void bench_decode_attention(Backend& be, const DecodeAttnBench& b, size_t l2_bytes, int reps, int trials,
                            std::mt19937& g, const ReportFn& report);
// "read units" rows (kernel_bench_read.cu): the same bytes read in different block orders (one
// window, GEMV-like items, one slice per block) at the sizes of a decode attention layer at ctx
// 32768 and of a 4-bit 4096x14336 weight.
void bench_read_patterns(int sms, size_t l2_bytes, int reps, int trials, const ReportFn& report);

// The 4-bit decode GEMV on backends made differently from the caller's (kernel_bench_gemv_alt.cu),
// each made on first use from bo: grouped() uploads `copies` random R x K weights in the grouped tile
// layout and times them as `name`; ablated() times the caller's copies ws of an R x K bf16
// double-quant weight through each of the default kernel's speed-of-light ablations (rows "gemv
// nf4-dq RxK T=1 ablate-lut|scale|bare"; wrong results, timing only). x [1, K], y [1, R].
class GemvAltBench {
 public:
  GemvAltBench(const CudaBackendOptions& bo, int reps, int trials, std::mt19937& g, ReportFn report);
  void grouped(int64_t R, int64_t K, bool dq, int copies, Act x, Act y, const std::string& name);
  void ablated(const std::vector<std::unique_ptr<Weight>>& ws, int64_t R, int64_t K, Act x, Act y);

 private:
  Backend& backend(int tile_group, int ablate);
  CudaBackendOptions bo_;
  int reps_, trials_;
  std::mt19937& g_;
  ReportFn report_;
  std::map<std::pair<int, int>, std::unique_ptr<Backend>> backends_;
};

}  // namespace nf4flash::kbench
