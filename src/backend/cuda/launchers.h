// Host-side entry points of the CUDA kernels (one launcher per op, params structs, no CUDA types
// beyond cudaStream_t). Implemented in ops_*.cu; used by cuda_backend.cu and the kernel bench.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace nf4flash::cuda {

// kernel-bench's empty-launch ablation: while an EmptyLaunches guard is alive on this thread,
// launch_k and launch_k_ptr (cuda_common.cuh) launch an empty kernel (pdl_trigger, pdl_wait,
// return) with the same grid, block and dynamic shared memory instead of the kernel asked for:
// the launches and their dependencies, none of their work. WRONG RESULTS by design; nothing but
// kernel-bench (and its test) sets one. Kernels launched with <<<>>> are not affected.
bool empty_launches();
class EmptyLaunches {
 public:
  explicit EmptyLaunches(bool on = true);
  ~EmptyLaunches();
  EmptyLaunches(const EmptyLaunches&) = delete;
  EmptyLaunches& operator=(const EmptyLaunches&) = delete;

 private:
  bool prev_;
};

// ---- 4-bit weights (layout: kernels/gemv_q4.cuh) --------------------------------------------
struct Q4Device {
  const uint8_t* tiles = nullptr;         // repacked codes, RT*KT tiles of 512 bytes
  const float* absmax_tiled = nullptr;    // plain: f32 absmax per (row, 64-col tile), [RT][KT][16]
  const uint8_t* absq_tiled = nullptr;    // double quant: u8 absmax code per (row, tile), [RT][KT][16]
  const float* nested_absmax = nullptr;   // double quant: as bitsandbytes
  const float* nested_code = nullptr;     // double quant: 256 floats
  float offset = 0.0f;
  float code[16] = {};
  int64_t rows = 0, cols = 0, RT = 0, KT = 0;
  int log2_blocksize = 6, log2_nested = 8;
  bool double_quant = false;
  // 0: tile16x64 (row tile rt's KT tiles contiguous, kernels/gemv_q4.cuh). G > 0 (kernel-bench's
  // experiment, CudaBackendOptions::q4_tile_group): groups of G column tiles of all row tiles side
  // by side, tile (rt, kt) at ((kt / G) * RT + rt) * G + kt % G, so that blocks on neighbouring row
  // tiles read neighbouring bytes at the same time; the absmax records (16 per tile) alike. Read by
  // the lean decode GEMV (h8u4d3, T = 1, G = 32) alone; every other 4-bit path refuses it.
  int tile_group = 0;
};

void q4_repack(const uint8_t* packed_dev, int64_t rows, int64_t cols, uint8_t* tiles_dev,
               cudaStream_t st);
// Per-tile records in [RT][KT] order (codes: 512 bytes, absmax: 16 u8 or 16 f32) -> dst in groups of G
// column tiles (Q4Device::tile_group); KT % G == 0, rec_bytes a multiple of 16.
void q4_group_tiles(const uint8_t* src_dev, int64_t RT, int64_t KT, int G, int rec_bytes, uint8_t* dst_dev,
                    cudaStream_t st);
// Refuses (Error naming `who`) a weight in the grouped tile layout: the paths that read tile16x64 only.
void q4_require_tile16x64(const Q4Device& w, const char* who);

struct GemvQ4Args {
  const Q4Device* w = nullptr;
  const void* x = nullptr;   // [T, cols], act dtype (BF16 or F16)
  DType act = DType::BF16;
  int T = 1;                 // 1..8
  const float* bias = nullptr;  // [rows] or null
  void* out = nullptr;       // [T, rows]
  DType out_dtype = DType::BF16;  // act or F32
  int grid = 0;              // 0: as many blocks as fit the GPU at once
};
void gemv_q4(const GemvQ4Args& a, cudaStream_t st);
constexpr int kGemvMaxRows = 8;
// 4-bit linears of up to this many rows run the GEMV in 8-row launches rather than dequantize +
// cuBLAS. Measured on the H200 (kernel-bench "threshold" rows, commit 6635328, nf4-dq):
//   14336x4096: T=16 44.3 vs 91.6 us, T=32 87.9 vs 88.8, T=64 175.1 vs 90.3
//   4096x14336: T=16 37.9 vs 90.8 us, T=32 75.4 vs 91.4, T=64 150.1 vs 94.1
// so the GEMV wins up to 32 rows and loses from 64. NF4FLASH_GEMV_MAX_ROWS overrides.
constexpr int kGemvRowsDefault = 32;

// ---- L2 prefetch plan of a captured decode step (kernels/l2_prefetch.cuh) --------------------
constexpr int kPfMaxGroups = 3, kPfMaxRanges = 4;
constexpr int kPfLookHost = 4;  // descriptors a kernel reads: its own and the next three (table ends zeroed)
struct L2PfRange {
  const uint8_t* ptr = nullptr;
  int64_t len = 0;  // multiple of 16
};
struct L2PfGroup {
  int64_t vlen = 0;  // sum of the ranges' lengths
  int32_t nr = 0, pad_ = 0;
  L2PfRange r[kPfMaxRanges];
};
struct L2PfLaunch {
  int64_t vstart = 0, vlen = 0, dist = 0;
  int32_t ng = 0, pad_ = 0;
  L2PfGroup g[kPfMaxGroups];
};

// Stream-K GEMV over up to kQsMaxSegs 4-bit weights sharing cols, code, quantization params
// and (double quant) nested code, with a fused epilogue (kernels/gemv_q4_stream.cuh). sm_90+.
constexpr int kQsMaxSegs = 3;
enum class GemvEpilogue : int { Store = 0, Residual = 1, SwiGLU = 2 };
struct Q4StreamSeg {
  const uint8_t* tiles = nullptr;
  const void* absmax = nullptr;          // f32 [RT][KT][16], or u8 codes (double quant)
  const float* nested_absmax = nullptr;  // double quant
  float offset = 0.0f;                   // double quant
  const float* bias = nullptr;           // [rows] or null
  void* out = nullptr;                   // [T, rows]: Store/SwiGLU (segment 0)/Residual (in place)
  int64_t rows = 0, RT = 0;
};
struct GemvQ4MultiArgs {
  const Q4Device* w[kQsMaxSegs] = {};
  const float* bias[kQsMaxSegs] = {};
  void* out[kQsMaxSegs] = {};
  int nseg = 1;
  GemvEpilogue ep = GemvEpilogue::Store;  // SwiGLU: w[0] = gate, w[1] = up, out[0] = result
  const void* x = nullptr;
  DType act = DType::BF16;
  int T = 1;
  DType out_dtype = DType::BF16;  // F32 only with Store
  float* partials = nullptr;      // >= gemv_q4_stream_partials_floats()
  int* counters = nullptr;        // zeroed, >= units (sum of row tiles; SwiGLU: gate row tiles)
  int64_t counters_len = 0;
  const L2PfLaunch* l2pf = nullptr;  // gemv_q4_seq: this launch's prefetch descriptor or null
  // gemv_q4_seq with gemv_q4_norm_fusable(T, cols): x is normalized first (rms_norm with this f32
  // weight [cols], bit for bit what rms_norm gives); null: x is used as it is
  const float* norm_w = nullptr;
  float norm_eps = 0.f;
  // gemv_q4_seq's stream-K form (gemv_q4_lean.cuh): kGemvSkSlotBytes per block, zeroed, for
  // sk_cap blocks; null: never stream-K
  unsigned long long* sk_slots = nullptr;
  int sk_cap = 0;
  int ablate = 0;  // gemv_q4_seq: kernel-bench's ablations (CudaBackendOptions::gemv_ablate; wrong results)
};
constexpr int kGemvSkSlotBytes = 2 * 128 * 8;
void gemv_q4_multi(const GemvQ4MultiArgs& a, cudaStream_t st);
// The in-order GEMV over the same segments and epilogues (kernels/gemv_q4_seq.cuh): blocks take
// whole units (row tiles; SwiGLU: gate then up row tile) in order, two batches of tiles per warp
// in flight, and prefetch the weights `dist` bytes ahead into L2 (a.l2pf). Any sm_80+ GPU; the
// prefetch needs sm_90.
void gemv_q4_seq(const GemvQ4MultiArgs& a, cudaStream_t st);
std::string_view gemv_q4_seq_cfg();  // the configuration in use (NF4FLASH_GEMV_SEQ_CFG or the default)
// Dependent in-order GEMVs (stage s reads what stage s-1 wrote; each stage as gemv_q4_seq takes
// it, with its norm) in one persistent launch of the lean kernel, when they qualify: 2..
// kGemvChainMaxStages stages with the same quantization (cols may differ), T and compute dtype.
// counters: kGemvChainMaxStages + 1 device words, zero (the launch leaves them zero). false:
// nothing launched (the caller runs the stages one launch each). launch = false: only whether it
// would.
constexpr int kGemvChainMaxStages = 4;
bool gemv_q4_chain(const GemvQ4MultiArgs* st, int n, unsigned* counters, cudaStream_t s, bool launch = true);
// Whether chains run as one launch at all: NF4FLASH_GEMV_CHAIN=1 (opt-in: measured slower than
// one launch per stage on the H200) and the in-order GEMV's configuration is one the chain is
// built for.
bool gemv_q4_chain_enabled();
// Whether gemv_q4_seq can fold an rms_norm of its input into its prologue for T tokens of cols
// columns (the lean kernel with 256-thread blocks, x staged in shared memory).
bool gemv_q4_norm_fusable(int64_t T, int64_t cols);

int64_t gemv_q4_stream_partials_floats();
// Whether the stream kernel can run on the current device (sm_90+, built for it) and is selected
// (NF4FLASH_GEMV_Q4 "stream" or "streamk"); gemv_q4_seq_enabled: the in-order kernel is
// (NF4FLASH_GEMV_Q4 unset, "auto" or "seq"); callers use gemv_q4 + elementwise ops otherwise.
bool gemv_q4_stream_enabled();
bool gemv_q4_seq_enabled();
bool gemv_q4_stream_supported();  // sm_90+, whatever NF4FLASH_GEMV_Q4 says
bool gemv_q4_stream_all();        // NF4FLASH_GEMV_Q4=stream: lone GEMVs take the stream kernel too

// Dequantize the whole weight into a dense [rows, cols] buffer of `dtype` (F32/F16/BF16).
// Rows [row0, row0 + nrows) of w (all when nrows < 0) to a dense [nrows, cols] matrix at out.
void q4_dequant(const Q4Device& w, void* out, DType dtype, cudaStream_t st, int64_t row0 = 0, int64_t nrows = -1);

// Fused 4-bit GEMM on Hopper tensor cores (kernels/gemm_q4_wgmma.cuh): out[T, rows] = x * W^T
// (+ bias), weights decoded into the tensor-core operands, no dense copy. Needs a build for sm_90a
// (CMAKE_CUDA_ARCHITECTURES containing 90) and a compute capability 9.0 device.
// Workspace of the fused GEMM's split tail (kernels/gemm_q4_wgmma_ws.cuh): f32 slices of the split
// units' accumulators and one counter per split unit (zeroed at allocation; every launch leaves
// them zero). Without it (or too small for a schedule) the launcher does not split.
struct Q4SplitWs {
  float* partial = nullptr;
  int64_t floats = 0;
  int* tickets = nullptr;
  int64_t n_tickets = 0;
};

struct GemmQ4Args {
  const Q4Device* w = nullptr;
  const void* x = nullptr;          // [T, cols], act dtype (BF16 or F16)
  DType act = DType::BF16;
  int64_t T = 0;
  const float* bias = nullptr;      // [rows] or null
  void* out = nullptr;              // [T, rows]
  DType out_dtype = DType::BF16;    // act or F32
  // split tail: the units of the last, partial wave of blocks split K s ways when the wave model
  // predicts a gain (kernels/gemm_q4_wgmma_ws.cuh), or as NF4FLASH_Q4GEMM_SPLITK=s says (1: never)
  Q4SplitWs split;
};
bool gemm_q4_wgmma_built();        // this build has the sm_90a kernel
bool gemm_q4_wgmma_supported();    // built, and the current device is compute capability 9.0
void gemm_q4_wgmma(const GemmQ4Args& a, cudaStream_t st);
// Several weights sharing x in one launch (warp-specialized kernel): out[i] = x W_i^T + bias[i] for
// nseg <= 3 weights with the same cols and quantization parameters (q, k, v); or, with swiglu,
// out[0] = silu(x W_0^T + b_0) * (x W_1^T + b_1), each product rounded to the compute dtype first
// (what linear + linear + silu_mul give, without the gate buffer). Output dtype = act.
struct GemmQ4MultiArgs {
  int nseg = 1;
  bool swiglu = false;
  const Q4Device* w[3] = {};
  const float* bias[3] = {};
  void* out[3] = {};
  const void* x = nullptr;
  DType act = DType::BF16;
  int64_t T = 0;
  Q4SplitWs split;  // as GemmQ4Args (not with swiglu)
};
void gemm_q4_wgmma_multi(const GemmQ4MultiArgs& a, cudaStream_t st);
// The block configuration for T rows over row_blocks blocks of 128 weight rows ("ws-n128s6":
// warp-specialized, 128 tokens, 6 stages), or NF4FLASH_Q4GEMM_CFG when set (one of
// gemm_q4_wgmma_cfgs()); multi launches need a ws-* configuration (false when the override names
// another).
std::string gemm_q4_wgmma_cfg(int64_t T, DType out_dtype, int64_t row_blocks);
bool gemm_q4_wgmma_multi_ok(int64_t T, int64_t row_blocks);
const char* const* gemm_q4_wgmma_cfgs();  // null-terminated

struct GemvDenseArgs {
  const void* w = nullptr;   // [N, K]
  DType w_dtype = DType::BF16;
  int64_t N = 0, K = 0;
  const void* x = nullptr;   // [T, K]
  DType act = DType::BF16;
  int T = 1;                 // 1..8
  const float* bias = nullptr;
  void* out = nullptr;       // [T, N]
  DType out_dtype = DType::BF16;
  const L2PfLaunch* l2pf = nullptr;  // this launch's prefetch descriptor (captured decode) or null
  bool residual = false;     // out += round(x W^T + b) (out in the compute dtype)
};
void gemv_dense(const GemvDenseArgs& a, cudaStream_t st);

// Dense decode GEMV over up to 3 weights sharing x in one launch (Store), or gate (w[0]) and up
// (w[1]) with the SwiGLU epilogue into out[0] (kernels/gemv_dense_multi.cuh): 16-bit weights and
// activations, K % 8 == 0, 16-byte aligned; applies() says whether these arguments qualify.
struct GemvDenseMultiArgs {
  const void* w[3] = {};
  int64_t N[3] = {};
  const float* bias[3] = {};
  void* out[3] = {};
  int nseg = 0;
  bool swiglu = false;
  DType w_dtype = DType::BF16;
  int64_t K = 0;
  const void* x = nullptr;
  DType act = DType::BF16;
  int T = 1;
  DType out_dtype = DType::BF16;
  // x = rms_norm(x) * norm_w first, bit for bit rms_norm's result (f32 [K]; null: x as it is); x
  // is then staged in shared memory: T * (2K + 16) bytes at most kDenseNormXMax
  const float* norm_w = nullptr;
  float norm_eps = 0.f;
};
constexpr int kDenseNormXMax = 40 * 1024;
bool gemv_dense_multi_applies(const GemvDenseMultiArgs& a);
void gemv_dense_multi(const GemvDenseMultiArgs& a, cudaStream_t st);

// ---- elementwise ------------------------------------------------------------------------------
void convert(const void* src, DType st_, void* dst, DType dt, int64_t n, cudaStream_t st);
void embed(const void* table, DType table_dtype, int64_t vocab, int64_t hidden, const int32_t* ids,
           int64_t T, void* out, DType act, cudaStream_t st);
void rms_norm(const void* x, const float* w, float eps, int64_t rows, int64_t cols, void* out,
              DType act, cudaStream_t st);
// x += delta (rounded to act), then out = rms_norm(x); x, delta, out [rows, cols].
void add_rms_norm(void* x, const void* delta, const float* w, float eps, int64_t rows, int64_t cols, void* out,
                  DType act, cudaStream_t st);
struct RopeArgs {
  void* q = nullptr;
  void* k = nullptr;
  DType act = DType::BF16;
  int64_t T = 0;
  int n_q_heads = 0, n_k_heads = 0, head_dim = 0;
  int64_t q_stride = 0, k_stride = 0;  // elements per row
  const float* inv_freq = nullptr;
  const int32_t* pos0 = nullptr;
};
void rope(const RopeArgs& a, cudaStream_t st);
void silu_mul(const void* gate, const void* up, void* out, int64_t n, DType act, cudaStream_t st);
// u[r, c] = silu(g[r, c]) * u[r, c], r < rows, c < cols, leading dimensions ldg, ldu (elements)
void silu_mul_cols(const void* g, int64_t ldg, void* u, int64_t ldu, int64_t rows, int64_t cols, DType act,
                   cudaStream_t st);
void add(const void* a, const void* b, void* out, int64_t n, DType act, cudaStream_t st);
void bias_add(void* out, DType dt, const float* bias, int64_t rows, int64_t cols, cudaStream_t st);

struct KvWriteArgs {
  const void* k = nullptr;
  const void* v = nullptr;
  DType act = DType::BF16;
  int64_t k_stride = 0, v_stride = 0;  // elements per row of k and v
  void* k_cache = nullptr;  // this layer: [n_kv][capacity][hd]
  void* v_cache = nullptr;
  DType kv_dtype = DType::BF16;
  int64_t T = 0, capacity = 0;
  int n_kv = 0, head_dim = 0;
  const int32_t* pos0 = nullptr;
};
void kv_write(const KvWriteArgs& a, cudaStream_t st);

// rope(q, k) then kv_write(k, v) in one kernel (r.k must be kv.k).
void rope_kv_write(const RopeArgs& r, const KvWriteArgs& kv, cudaStream_t st);

// ---- attention (kernels/attention_*.cuh) --------------------------------------------------------
struct AttnArgs {
  const void* q = nullptr;   // [T, n_heads*hd] (row stride q_stride elements)
  void* out = nullptr;       // [T, n_heads*hd] (row stride out_stride)
  DType act = DType::BF16;
  int64_t q_stride = 0, out_stride = 0;
  const void* k_cache = nullptr;  // this layer [n_kv][capacity][hd]
  const void* v_cache = nullptr;
  DType kv_dtype = DType::BF16;
  int64_t capacity = 0;
  int T = 0, n_heads = 0, n_kv = 0, head_dim = 0;
  float scale = 1.0f;
  const int32_t* pos0 = nullptr;
  float* workspace = nullptr;     // split-K partials (decode)
  int64_t workspace_floats = 0;
  int* counters = nullptr;  // decode: >= T * n_heads zeroed ints (the fused combine; null: combine kernel)
  int num_sms = 132;
  int dec_min_chunk = 64;  // decode: fewest positions per split (attention_decode sets it)
  // decode: 1 = the active splits take the context's block steps round robin instead of one slice
  // each (NF4FLASH_DECODE_ORDER=interleave; attention_decode sets it; decode_span in attention.cuh)
  int dec_interleave = 0;
  // attention_decode_rope (T = 1): this step's k and v rows [n_kv*hd], unrotated like q, and the
  // rope frequencies [hd/2]; dec_cluster: splits per thread-block cluster (the launcher sets it)
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  const float* inv_freq = nullptr;
  int dec_cluster = 0;
};
// Flash-decoding (split along the sequence): T small (<= kDecodeMaxRows).
void attention_decode(const AttnArgs& a, cudaStream_t st);
constexpr int kDecodeMaxRows = 4;
constexpr int kDecodeMaxSplits = 128;
// rope(q, k) + kv_write(k, v) + attention_decode for one token (T = 1) in one launch: q, k_new
// and v_new unrotated (left so: the kernel keeps the rotated values to itself), k and v written to
// the cache at pos0. Splits merged in a thread-block cluster (or, past one cluster's reach, by the
// last cluster). Opt-in (NF4FLASH_DECODE_FUSED=1: measured slower end to end); where
// attention_decode_rope_unsupported(a) is non-empty (why), the caller runs rope_kv_write +
// attention_decode instead.
void attention_decode_rope(const AttnArgs& a, cudaStream_t st);
std::string attention_decode_rope_unsupported(const AttnArgs& a);
// Whether the fused form is asked for (NF4FLASH_DECODE_FUSED=1; a bad value is refused by name):
// callers test it before building arguments, so the default path does no work for it.
bool attention_decode_rope_enabled();
// Clusters of C (<= 8) fused decode blocks this GPU holds at once (cudaOccupancyMaxActiveClusters).
int decode_rope_resident_clusters(int C);
// Whether decode attention merges its splits in the last split block (NF4FLASH_ATTN_COMBINE).
bool attention_combine_fused();
constexpr int kDecodeCounters = 4096;  // ints the caller zeroes once: T * n_heads <= this
// Partials for T tokens (the counters of the fused combine are separate: T * n_heads ints).
int64_t attention_decode_workspace_floats(int T, int n_heads, int head_dim);
// Tiled causal attention with online softmax (any T), CUDA cores ("sdpa").
void attention_prefill(const AttnArgs& a, cudaStream_t st);
// FlashAttention-2 forward on tensor cores (any T; used for T > kDecodeMaxRows): bf16/f16 compute,
// KV cache of the same dtype, head_dim 64 or 128. Empty string = servable, else why not.
std::string attention_flash_unsupported(DType act, DType kv_dtype, int head_dim);
void attention_flash(const AttnArgs& a, cudaStream_t st);
// The Hopper form of the flash kernel (wgmma + TMA, kernels/attention_flash_wgmma.cuh): same
// contract as attention_flash (checked by it); built for sm_90a only. attention_flash takes it on a
// CC 9.0 GPU unless NF4FLASH_FLASH_KERNEL=mma (=wgmma where it cannot run is an error);
// `overlap`: FA3's intra-warpgroup overlap and ping-pong (false: NF4FLASH_FLASH_KERNEL=wgmma-serial).
enum class FlashKernel { Mma, Wgmma, WgmmaSerial };
FlashKernel attention_flash_kernel();
bool attention_flash_wgmma_built();
bool attention_flash_wgmma_supported();
void attention_flash_wgmma(const AttnArgs& a, cudaStream_t st, bool overlap);

// Eager (materialized scores, as transformers' eager): S = Q K^T and O = P V by cuBLAS per kv-head
// group (strided batches over the group's q heads, K/V never repeated), softmax kernel between.
// Scores are f32 [heads][rows][L]; P is in the compute dtype. L = the key length computed over:
// pos0_host + T when the host knows pos0 (rows are then chunked with causal lengths), else the
// whole cache capacity with the tail masked (capturable: pos0 stays in device memory).
struct EagerSoftmaxArgs {
  const float* s = nullptr;  // [heads][rows][L] raw scores
  void* p = nullptr;         // [heads][rows][L] probabilities, dtype p_dtype
  DType p_dtype = DType::BF16;
  int heads = 0, rows = 0;
  int64_t L = 0;
  int row0 = 0;              // query row of rows[0] within the step (position pos0 + row0 + r)
  float scale = 1.0f;
  const int32_t* pos0 = nullptr;
};
void attention_eager_softmax(const EagerSoftmaxArgs& a, cudaStream_t st);

// ---- sampling ---------------------------------------------------------------------------------
// Greedy argmax over logits [vocab] (F32) with an optional repetition penalty over history ids;
// writes the id to out_id (device). scratch: >= 2*kArgmaxBlocks floats/ints.
constexpr int kArgmaxBlocks = 256;
void argmax(const float* logits, int64_t vocab, const int32_t* history, int n_history,
            float repeat_penalty, void* scratch, int32_t* out_id, cudaStream_t st);

// The next token from logits [vocab] (F32) as sample_with_uniform() picks it on the host
// (sampling/sampler.h): repetition penalty over the history ids, temperature (<= 0: greedy),
// top-k, top-p, min-p, then the draw with `uniform`. Kernels: kernels/sample_topk.cuh.
struct SampleArgs {
  const float* logits = nullptr;     // [vocab] F32, device
  int64_t vocab = 0;                 // 1 .. kSampleMaxVocab
  const int32_t* history = nullptr;  // [n_history] ids, device (used when repeat_penalty != 1)
  int n_history = 0;
  // device count of the history ids (the pipelined decode loop, whose history grows on the device);
  // then n_history is the history's capacity and the kernels read min(*history_count, n_history)
  const int32_t* history_count = nullptr;
  float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, repeat_penalty = 1.0f;
  int top_k = 0;
  float uniform = 0.0f;              // in [0, 1)
  void* workspace = nullptr;         // sample_workspace_bytes(vocab) bytes, zero-filled once when allocated
  size_t workspace_bytes = 0;
};
constexpr int64_t kSampleMaxVocab = int64_t(1) << 24;
size_t sample_workspace_bytes(int64_t vocab);
// Enqueues the sampling kernels; returns the device address of the chosen id (in the workspace).
const int32_t* sample(const SampleArgs& a, cudaStream_t st);
// After sample(): next_id[0] = id[0], pos[0] += 1, and with a history (capacity hist_cap) the id
// appended to it, *hist_count += 1 (device; the pipelined decode loop's hand-over).
void decode_advance(const int32_t* id, int32_t* next_id, int32_t* pos, int32_t* hist, int32_t* hist_count,
                    int hist_cap, cudaStream_t st);

}  // namespace nf4flash::cuda
