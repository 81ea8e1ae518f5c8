// Host-side entry points of the CUDA kernels (one launcher per op, params structs, no CUDA types
// beyond cudaStream_t). Implemented in ops_*.cu and sm90a/; used by the CUDA backend and bench/kernels.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/dtype.h"

namespace nf4flash::cuda {

// Programmatic dependent launch (launch_k, cuda_common.cuh): on where the device has compute
// capability >= 9.0 and the backend's tuning asks for it (CudaTuning::pdl, set when a backend is
// created; process-wide).
void set_pdl_requested(bool on);
bool pdl_enabled();

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
};

void q4_repack(const uint8_t* packed_dev, int64_t rows, int64_t cols, uint8_t* tiles_dev,
               cudaStream_t st);

constexpr int kGemvMaxRows = 8;
// 4-bit linears of up to CudaTuning::gemv_max_rows rows (default 8: the decode GEMV) run a GEMV
// (9..32 rows the register GEMV in launches of 8) rather than the fused 4-bit GEMM. The fused GEMM
// costs about the same from 8 to 64 rows (H200 at 14fd2fa, 14336x4096: 36.4 / 36.6 / 37.0 us at
// T = 8 / 16 / 32 against the GEMV's 20.8 / 41.2 / 81.8): the batched engine's decode at 32
// sequences (llama3-8b NF4 dq, H100) ran 4408 tok/s with 8 against 2525 with the former default 32.

// The register-prefetch GEMV (kernels/gemv_q4.cuh): one weight, T <= 8 tokens, plain store.
struct GemvQ4Args {
  const Q4Device* w = nullptr;
  const void* x = nullptr;   // [T, cols], act dtype (BF16 or F16)
  DType act = DType::BF16;
  int T = 1;                 // 1..8
  const float* bias = nullptr;  // [rows] or null
  void* out = nullptr;       // [T, rows]
  DType out_dtype = DType::BF16;  // act or F32
};
void gemv_q4(const GemvQ4Args& a, cudaStream_t st);

// The decode GEMV (kernels/gemv_q4_decode.cuh) over up to kGemvMaxSegs 4-bit weights sharing x,
// cols and quantization parameters (the nested code table of w[0] serves all), with a fused
// epilogue: Store (out[i] = x W_i^T + b_i: q, k, v), Residual (out[0] += round(x W^T + b)), SwiGLU
// (w[0] = gate, w[1] = up: out[0] = silu(round(gate)) * round(up)). With norm_w, x is replaced by
// rms_norm(x) * norm_w first (bit for bit what rms_norm gives) where gemv_q4_norm_fusable says so.
// x is staged in shared memory where it fits, else read from global memory.
constexpr int kGemvMaxSegs = 3;
enum class GemvEpilogue : int { Store = 0, Residual = 1, SwiGLU = 2 };
struct GemvQ4DecodeArgs {
  const Q4Device* w[kGemvMaxSegs] = {};
  const float* bias[kGemvMaxSegs] = {};
  void* out[kGemvMaxSegs] = {};
  int nseg = 1;
  GemvEpilogue ep = GemvEpilogue::Store;
  const void* x = nullptr;        // [T, cols]
  DType act = DType::BF16;
  int T = 1;                      // 1..kGemvMaxRows
  DType out_dtype = DType::BF16;  // F32 only with Store
  const float* norm_w = nullptr;  // f32 [cols] or null
  float norm_eps = 0.f;
};
void gemv_q4_decode(const GemvQ4DecodeArgs& a, cudaStream_t st);
// Whether gemv_q4_decode can fold an rms_norm of its input into its prologue for T tokens of cols
// columns (x staged in shared memory).
bool gemv_q4_norm_fusable(int64_t T, int64_t cols);

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
  // predicts a gain (kernels/gemm_q4_wgmma_ws.cuh)
  Q4SplitWs split;
};
bool gemm_q4_wgmma_built();        // this build has the sm_90a kernel
bool gemm_q4_wgmma_supported();    // built, and the current device is compute capability 9.0
void gemm_q4_wgmma(const GemmQ4Args& a, cudaStream_t st);
// Several weights sharing x in one launch: out[i] = x W_i^T + bias[i] for nseg <= 3 weights with the
// same cols and quantization parameters (q, k, v; gate and up). Output dtype = act.
struct GemmQ4MultiArgs {
  int nseg = 1;
  const Q4Device* w[3] = {};
  const float* bias[3] = {};
  void* out[3] = {};
  const void* x = nullptr;
  DType act = DType::BF16;
  int64_t T = 0;
  Q4SplitWs split;  // as GemmQ4Args
};
void gemm_q4_wgmma_multi(const GemmQ4MultiArgs& a, cudaStream_t st);
// The block configuration the launch of T rows over row_blocks blocks of 128 weight rows of K columns takes
// (e.g. "ws-n128s6": warp-specialized, 128 tokens a block, 6 stages), for the reported path.
std::string gemm_q4_wgmma_cfg(int64_t T, DType out_dtype, int64_t row_blocks, int64_t K);

// The skinny 4-bit GEMM (kernels/gemm_q4_skinny.cuh): the batched decode step's linears,
// out[i] = x W_i^T + bias[i] for up to 3 weights sharing x, cols and quantization parameters (the
// nested code table of w[0] serves all), T <= kQ4SkinnyMaxRows rows, the decode GEMV's arithmetic.
// Its workspace (a Q4SplitWs): f32 slots for the units cut between blocks and one counter per unit
// (zeroed at allocation; every launch leaves them zero); gemm_q4_skinny_ws_needed says how much a
// launch needs.
constexpr int kQ4SkinnyMaxRows = 64;
using GemmQ4SkinnyWs = Q4SplitWs;
struct GemmQ4SkinnyArgs {
  int nseg = 1;
  const Q4Device* w[3] = {};
  const float* bias[3] = {};
  void* out[3] = {};
  const void* x = nullptr;        // [T, cols]
  DType act = DType::BF16;
  int T = 1;
  DType out_dtype = DType::BF16;  // act or F32
  bool wgmma = false;             // the wgmma form at 17..32 rows (sm_90a; gemm_q4_skinny_wgmma_supported)
  GemmQ4SkinnyWs ws;
};
GemmQ4SkinnyWs gemm_q4_skinny_ws_needed(const GemmQ4SkinnyArgs& a);  // sizes only, no pointers
// The most rows the kernel serves on a device with this much opt-in shared memory per block (its
// 6-stage ring and code table take 131.5 / 145 / 172 KiB at up to 16 / 32 / 64 rows, plus ~1 KiB of
// static shared memory): 64 on Hopper, 32 on the A100,
// 0 on GPUs with 99 KiB (RTX 30 and 40 series).
int gemm_q4_skinny_max_rows(size_t smem_per_block);
void gemm_q4_skinny(const GemmQ4SkinnyArgs& a, cudaStream_t st);
// The wgmma form (sm90a/gemm_q4_skinny_wgmma.cu): built for sm_90a and the device is CC 9.0; the
// rows it serves when GemmQ4SkinnyArgs::wgmma is set (17..32; fewer take mma.sync).
bool gemm_q4_skinny_wgmma_supported();
bool gemm_q4_skinny_wgmma_rows(int64_t T);
void gemm_q4_skinny_wgmma(const GemmQ4SkinnyArgs& a, cudaStream_t st);

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
};
bool gemv_dense_multi_applies(const GemvDenseMultiArgs& a);
void gemv_dense_multi(const GemvDenseMultiArgs& a, cudaStream_t st);

// ---- elementwise ------------------------------------------------------------------------------
void convert(const void* src, DType st_, void* dst, DType dt, int64_t n, cudaStream_t st);
// vocab: the table's rows; shard_row0 >= 0: they are vocabulary rows [shard_row0, + vocab), other
// ids give zero rows (a tensor-parallel rank's shard)
void embed(const void* table, DType table_dtype, int64_t vocab, int64_t hidden, const int32_t* ids,
           int64_t T, void* out, DType act, cudaStream_t st, int64_t shard_row0 = -1);
void rms_norm(const void* x, const float* w, float eps, int64_t rows, int64_t cols, void* out,
              DType act, cudaStream_t st);
// x += delta (rounded to act), then out = rms_norm(x); x, delta, out [rows, cols].
void add_rms_norm(void* x, const void* delta, const float* w, float eps, int64_t rows, int64_t cols, void* out,
                  DType act, cudaStream_t st);
// A step over several sequences in the paged KV cache (StepState::paged, device arrays): the rows
// of sequence i are [row_start[i], row_start[i+1]) at positions pos0[i], pos0[i] + 1, ...; the
// cache of one layer is [n_kv][n_blocks * block_size][hd] and position p of sequence i lives at
// cache position tables[i * max_blocks + p / block_size] * block_size + p % block_size.
// tables == nullptr: one sequence over the contiguous cache (the step's pos0).
struct PagedRows {
  const int32_t* row_start = nullptr;
  const int32_t* pos0 = nullptr;
  const int32_t* tables = nullptr;
  int n_seqs = 0, max_blocks = 0, block_size = 0;
};

struct RopeArgs {
  void* q = nullptr;
  void* k = nullptr;
  DType act = DType::BF16;
  int64_t T = 0;
  int n_q_heads = 0, n_k_heads = 0, head_dim = 0;
  int64_t q_stride = 0, k_stride = 0;  // elements per row
  const float* inv_freq = nullptr;
  // longrope: rows of a forward (of a sequence, when paged) ending past long_after positions use
  // inv_freq_long; cos and sin are multiplied by mscale (longrope, yarn)
  const float* inv_freq_long = nullptr;
  int64_t long_after = 0;
  float mscale = 1.0f;
  // dynamic NTK: rows of a forward ending at L > dynamic_after compute their frequencies from L
  // (RopeParams' formula) instead of reading inv_freq; 0: off
  int64_t dynamic_after = 0;
  float dynamic_theta = 0.0f, dynamic_factor = 1.0f;
  const int32_t* pos0 = nullptr;
  PagedRows paged;  // set: rows of several sequences, positions per sequence (pos0 unused)
  // rope_kv_write only: q and k heads normed first (rms_norm, f32 weights [head_dim]); null: none
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float norm_eps = 0.f;
};
// Head sizes whose q/k norms rope_kv_write takes in its own pass (else rms_norm runs first).
inline bool rope_norm_fusable(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }
void rope(const RopeArgs& a, cudaStream_t st);
void silu_mul(const void* gate, const void* up, void* out, int64_t n, DType act, cudaStream_t st);
void gelu_tanh_mul(const void* gate, const void* up, void* out, int64_t n, DType act, cudaStream_t st);
// x = x * s, or with softcap x = tanh(x / s) * s; x [n] of dtype dt (the compute dtype or F32 logits)
void scale(void* x, float s, bool softcap, int64_t n, DType dt, cudaStream_t st);
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
  PagedRows paged;  // set: rows of several sequences, written to their blocks (pos0 unused)
};
void kv_write(const KvWriteArgs& a, cudaStream_t st);

// rope(q, k) then kv_write(k, v) in one kernel (r.k must be kv.k).
void rope_kv_write(const RopeArgs& r, const KvWriteArgs& kv, cudaStream_t st);

// ---- attention (kernels/attention_*.cuh) --------------------------------------------------------
// The prompt flash kernel: mma.sync (any sm_80+ GPU) or wgmma + TMA (sm_90a build on a CC 9.0 GPU).
enum class FlashKernel : uint8_t { Mma, Wgmma };

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
  // scores soft-capped as tanh(s * scale / softcap) * softcap (0: none); a query at position p
  // sees keys (p - window, p] (0: all earlier ones)
  float softcap = 0.0f;
  int window = 0;
  const int32_t* pos0 = nullptr;
  float* workspace = nullptr;     // split-K partials (decode)
  int64_t workspace_floats = 0;
  int num_sms = 132;
  FlashKernel flash = FlashKernel::Mma;  // attention_flash: the kernel (the backend resolves it once)
  // set: rows of several sequences over the paged cache (attention_paged_decode; pos0 unused)
  PagedRows paged;
  // attention_paged_decode: rows of sequences with more rows than this are skipped (the backend
  // computes them by gathering the sequence's blocks for the prompt kernels)
  int paged_max_rows = 0;
};
// Flash-decoding (split along the sequence): T small (<= kDecodeMaxRows).
void attention_decode(const AttnArgs& a, cudaStream_t st);
// The head dims every attention kernel runs (32, 64, 80, 96, 128, 256).
bool attention_head_dim_supported(int head_dim);
constexpr int kDecodeMaxRows = 4;
constexpr int kDecodeMaxSplits = 128;
// Flash-decoding of every row of a paged step whose sequence has at most a.paged_max_rows rows
// (each row attends over its own sequence's blocks, ragged lengths; any T).
void attention_paged_decode(const AttnArgs& a, cudaStream_t st);
// The splits attention_paged_decode uses for a.T rows, and its workspace in floats.
int64_t attention_paged_workspace_floats(const AttnArgs& a);
// Copies positions [0, len) of sequence `seq`'s blocks (layer caches k_src/v_src as in PagedRows)
// into contiguous caches k_dst/v_dst [n_kv][dst_capacity][hd] (the prompt kernels' layout).
void paged_gather_kv(const void* k_src, const void* v_src, int64_t src_capacity, const PagedRows& p, int seq,
                     int len, void* k_dst, void* v_dst, int64_t dst_capacity, int n_kv, int head_dim,
                     DType kv_dtype, cudaStream_t st);
// out[i, :] = x[rows[i], :] for i < n_out (rows in device memory), row width cols elements of `es` bytes.
void gather_rows(const void* x, const int32_t* rows, void* out, int64_t n_out, int64_t cols, size_t es,
                 cudaStream_t st);
// Partials (m, l, acc) of every split for T tokens.
int64_t attention_decode_workspace_floats(int T, int n_heads, int head_dim);
// Tiled causal attention with online softmax (any T), CUDA cores ("sdpa").
void attention_prefill(const AttnArgs& a, cudaStream_t st);
// FlashAttention-2 forward on tensor cores (any T; used for T > kDecodeMaxRows): bf16/f16 compute,
// KV cache of the same dtype, head_dim 64 or 128. Empty string = servable, else why not.
std::string attention_flash_unsupported(DType act, DType kv_dtype, int head_dim);
void attention_flash(const AttnArgs& a, cudaStream_t st);
// The Hopper form of the flash kernel (wgmma + TMA, kernels/attention_flash_wgmma.cuh): same
// contract as attention_flash (checked by it); built for sm_90a only. attention_flash runs it when
// AttnArgs::flash says Wgmma.
bool attention_flash_wgmma_built();
bool attention_flash_wgmma_supported();  // built, and the current device is compute capability 9.0
void attention_flash_wgmma(const AttnArgs& a, cudaStream_t st);
// The head dims the Hopper kernel runs (the mma.sync kernel takes the others).
inline bool attention_flash_wgmma_head_dim(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

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
  float softcap = 0.0f;      // as AttnArgs
  int window = 0;
  const int32_t* pos0 = nullptr;
};
void attention_eager_softmax(const EagerSoftmaxArgs& a, cudaStream_t st);

// ---- sampling ---------------------------------------------------------------------------------
// Greedy argmax over logits [vocab] (F32) with an optional repetition penalty over history ids;
// writes the id to out_id (device). scratch: >= 2*kArgmaxBlocks floats/ints.
constexpr int kArgmaxBlocks = 256;
void argmax(const float* logits, int64_t vocab, const int32_t* history, int n_history,
            float repeat_penalty, void* scratch, int32_t* out_id, cudaStream_t st);
// Greedy argmax of each of n rows of logits [n, vocab] (F32) -> out_ids[n] (device); scratch:
// >= n * 2 * kArgmaxRowBlocks floats/ints.
constexpr int kArgmaxRowBlocks = 32;
void argmax_rows(const float* logits, int64_t n, int64_t vocab, void* scratch, int32_t* out_ids, cudaStream_t st);

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
