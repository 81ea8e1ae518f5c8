// In-order fused 4-bit GEMV over up to three weights with fused epilogues, prefetching the
// weights ahead into L2 (the decode GEMV).
//
//   out_s[n, r] = epilogue( sum_k x[n, k] * code[q_s(r, k)] * absmax_s(r, k) + bias_s[r] ),  n < T <= 8
//
// Weights: the tile16x64 layout of gemv_q4.cuh (512 bytes of codes per 16 rows x 64 columns, row
// tile rt's KT tiles contiguous), absmax [RT][KT][16] (f32, or u8 codes for double quant decoded
// in the kernel through the nested code table). x: [T, cols] bf16/f16, staged in shared memory when
// it fits (decode: always), else read from global (L1); f32 accumulation. Epilogues as the stream-K kernel (gemv_q4_stream.cuh):
//   Store    : out_s [T, rows_s] = x W_s^T + b_s      (q, k and v in one launch)
//   Residual : out   [T, rows]  += round(x W^T + b)   (o_proj / down_proj with the residual add)
//   SwiGLU   : out   [T, rows]   = silu(round(x G^T + bg)) * round(x U^T + bu), rounded
//
// Work: a unit is one row tile of the concatenated segments (Store/Residual), or one gate row tile
// followed by the same up row tile (SwiGLU, nsub = 2); block b takes units b, b + G, ... in order,
// so the launch consumes its weights front to back (what the L2 prefetch assumes). Inside a unit
// (one "item" per sub), warp w takes column tiles b*W*U + u*W + w in batches of U tiles, and loads
// the next batch (across item and unit boundaries) before decoding the current one: the
// register pipeline of gemv_q4_kernel (w16u2m2a2: 16 warps, 2 tiles a batch, 2 blocks per SM,
// byte_perm table addressing into the [256][64] per-lane table).
// Reduction: per item the warps' mma accumulators (rows g, g+8 x tokens 2t, 2t+1) are summed in
// shared memory, then 128 threads (16 rows x 8 tokens) run the epilogue; SwiGLU keeps the rounded
// gate values in shared memory for the up item.
// Prefetch (kernels/l2_prefetch.cuh): when a block starts loading unit u, thread 0 asks the L2 for
// the unit's share of the virtual weight stream `dist` bytes ahead.
#pragma once
#include <string_view>

#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/kernels/l2_prefetch.cuh"
#include "backend/cuda/kernels/norm_prologue.cuh"

namespace nf4flash::cuda {

struct Q4SeqArgs {
  Q4StreamSeg seg[kQsMaxSegs];
  int64_t unit_end[kQsMaxSegs];  // Store/Residual: cumulative row tiles of segments 0..k
  float code[16];
  const float* nested_code;
  int64_t cols, KT, units;
  int log2_blocksize, log2_nested;
  int nseg, nsub, T, out_f32, ep;
  const void* x;
  int x_stride;          // > 0: x staged in shared memory after the table, rows of x_stride bytes
  const L2PfLaunch* pf;  // null: no prefetch
  const float* norm_w;   // lean kernel only: x = rms_norm(x) * norm_w first (f32 [cols]); null: none
  float norm_eps;
  // lean kernel, stream-K form only (kLeanSK): per block 2 x 128 tagged partial sums (zero between
  // launches), sk_cap blocks' worth
  unsigned long long* sk_slots;
  int sk_cap;
  int tile_group;  // the segments' Q4Device::tile_group (0: tile16x64; else the lean kernel's grouped form)
  int ablate;      // kernel-bench's ablations (CudaBackendOptions::gemv_ablate; 0: none)
};

// Row stride of x staged in shared memory (16 bytes of padding: rows of different tokens start on
// different banks).
__host__ __device__ constexpr int seq_x_stride(int64_t cols) { return int(cols * 2 + 16); }

// Segment and row tile of (unit u, sub) (SwiGLU: the sub picks gate or up; else the segment whose
// cumulative row tiles hold u). I: the caller's index type.
template <typename I>
__device__ __forceinline__ int q4_seq_segment(const Q4SeqArgs& a, I u, int sub, I& rt) {
  if (a.nsub == 2) {
    rt = u;
    return sub;
  }
  int k = 0;
  while (k + 1 < a.nseg && u >= I(a.unit_end[k])) ++k;
  rt = u - (k ? I(a.unit_end[k - 1]) : I(0));
  return k;
}

// x [T][cols] staged into shared memory rows of a.x_stride bytes (norm_prologue.cuh).
template <typename TA>
__device__ __forceinline__ void q4_seq_stage_x(const Q4SeqArgs& a, uint8_t* xs) {
  stage_x_rows<TA>(a.x, a.T, a.cols, a.x_stride, xs);
}

// One output of an item, by thread tid < 128 (row rt*16 + tid/8, token tid%8): y = the item's sum
// (bias not added) through the epilogue; SwiGLU: sub 0 parks the rounded gate value in gate_v[tid],
// sub 1 stores silu(gate) * up.
template <typename TA>
__device__ __forceinline__ void seq_item_out(const Q4SeqArgs& a, int k, int64_t rt, int sub, int tid, float y,
                                             float* gate_v) {
  const Q4StreamSeg& sg = a.seg[k];
  const int r = tid >> 3, n = tid & 7;
  const int64_t row = rt * 16 + r;
  if (n >= a.T || row >= sg.rows) return;
  if (sg.bias) y += sg.bias[row];
  if (a.ep == int(GemvEpilogue::SwiGLU)) {
    const float yr = to_f32<TA>(from_f32<TA>(y));
    if (sub == 0) gate_v[tid] = yr;
    else q4_store_swiglu<TA>(a.seg[0].out, int64_t(n) * sg.rows + row, gate_v[tid], yr);
  } else {
    q4_store_y<TA>(sg.out, int64_t(n) * sg.rows + row, y, a.out_f32, a.ep == int(GemvEpilogue::Residual));
  }
}

// The warps' mma accumulators (rows g, g+8 x tokens 2t, 2t+1) into red, then a barrier; after it
// seq_item_y(red, o) is the sum over the W warps of output o (row o/8, token o%8), o < 128.
template <int W>
__device__ __forceinline__ void seq_item_publish(float (&red)[W][16][8], const float* acc) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  red[warp][g][2 * t] = acc[0];
  red[warp][g][2 * t + 1] = acc[1];
  red[warp][g + 8][2 * t] = acc[2];
  red[warp][g + 8][2 * t + 1] = acc[3];
  __syncthreads();
}
template <int W>
__device__ __forceinline__ float seq_item_y(const float (&red)[W][16][8], int o) {
  float y = 0.f;
#pragma unroll
  for (int w = 0; w < W; ++w) y += red[w][o >> 3][o & 7];
  return y;
}

// The end of one item (row tile rt of segment k; SwiGLU: sub 0 = gate, 1 = up): the warps' mma
// accumulators (rows g, g+8 x tokens 2t, 2t+1) summed in shared memory, then 128 threads (16 rows x
// 8 tokens) run the epilogue. END_SYNC: ends with a barrier (red and gate_v may be reused); without
// it the caller alternates two red buffers (the next item's barrier orders the reuse).
template <typename TA, int W, bool END_SYNC = true>
__device__ __forceinline__ void seq_item_epilogue(const Q4SeqArgs& a, float (&red)[W][16][8], float* gate_v,
                                                  const float* acc, int k, int64_t rt, int sub) {
  seq_item_publish<W>(red, acc);
  if (threadIdx.x < 128) seq_item_out<TA>(a, k, rt, sub, int(threadIdx.x), seq_item_y<W>(red, threadIdx.x), gate_v);
  if constexpr (END_SYNC) __syncthreads();
}

// The absmax of the lane's row from its raw load: the f32 absmax, or (u8 code, nested absmax) for
// double quant, decoded as bitsandbytes does (product rounded, then the offset).
template <bool DQ>
__device__ __forceinline__ float q4_scale_decode(float2 raw, float offset, const float* s_nested_code) {
  if constexpr (DQ) return __fadd_rn(__fmul_rn(s_nested_code[__float_as_int(raw.x)], raw.y), offset);
  else return raw.x;
}

// One tile of the in-order kernels: the lane's 16 code bytes against its x fragments (mma), the
// partial sums of rows g, g + 8 scaled by the absmax held by lanes src0, src8 (sv: each lane's
// decoded absmax) and added to acc. (Splitting the four mma into two chains measured no faster:
// H200, ninth session, s8u4d3.)
// NALU, tl, th: q4_tile_mma_prmt's register-table decode of the first NALU code words.
// T1: one token (T = 1): the accumulators of token column 1 (acc[1], acc[3]) are never stored, so
// they are not scaled and added.
// ABL, NOSCALE (kernel-bench's ablations, gemv_q4_lean.cuh; wrong results): q4_tile_mma_prmt's
// ablated decode; NOSCALE: the mma accumulates into acc unscaled (no shuffles, no scale FMAs).
template <typename TA, int NALU = 0, bool T1 = false, int ABL = 0, bool NOSCALE = false>
__device__ __forceinline__ void q4_tile_apply(uint32_t lut_s, uint32_t lane_b, const uint4& wq, const uint4& xa,
                                              const uint4& xb, float sv, int src0, int src8, float* acc,
                                              const uint32_t* tl = nullptr, const uint32_t* th = nullptr) {
  if constexpr (NOSCALE) {
    q4_tile_mma_prmt<TA, 2, NALU, ABL>(lut_s, lane_b, wq, xa, xb, acc, tl, th);
    return;
  }
  const float s0 = __shfl_sync(0xffffffffu, sv, src0);
  const float s8 = __shfl_sync(0xffffffffu, sv, src8);
  float dd[4] = {0.f, 0.f, 0.f, 0.f};
  q4_tile_mma_prmt<TA, 2, NALU, ABL>(lut_s, lane_b, wq, xa, xb, dd, tl, th);
  acc[0] = fmaf(dd[0], s0, acc[0]);
  acc[2] = fmaf(dd[2], s8, acc[2]);
  if constexpr (!T1) {
    acc[1] = fmaf(dd[1], s0, acc[1]);
    acc[3] = fmaf(dd[3], s8, acc[3]);
  }
}

// A tile whose lanes r and r + 16 both loaded row r's absmax (raw).
template <typename TA, bool DQ, int NALU = 0, bool T1 = false>
__device__ __forceinline__ void q4_tile_scaled(uint32_t lut_s, uint32_t lane_b, const uint4& wq, const uint4& xa,
                                               const uint4& xb, float2 raw, float offset, const float* s_nested_code,
                                               int g, float* acc, const uint32_t* tl = nullptr,
                                               const uint32_t* th = nullptr) {
  q4_tile_apply<TA, NALU, T1>(lut_s, lane_b, wq, xa, xb, q4_scale_decode<DQ>(raw, offset, s_nested_code), g, g + 8,
                              acc, tl, th);
}

// Configurations (ops_gemv.cu, NF4FLASH_GEMV_SEQ_CFG): w<W>u<U>d<D>[m<MINB>], 2 blocks per SM
// unless m1; l... / a... / p... / h...: the lean kernel (gemv_q4_lean.cuh, LeanFlags). Register
// use (sm_90, bf16, dq, x staged): w8u2d4 113, w8u4d3 128, no spills; w16u2d2 64 with ~260 bytes
// spilled. H200, 2026-12-03 (decode @512 tok/s; one layer's GEMVs): w8u4d3 316.3, 71.0 us;
// w16u4d3m1 302.8, 76.8 us; w8u2d4 283.0, 84.7 us; w16u2d2 224.2, 113.2 us; lean l8u4d3 387.3,
// 54.0 us; lean a8u4d3 (barrier-free reduction) 354.9, 59.8 us; a8u4d4 352.8; a16u4d3m1 318.0;
// ninth session: p8u4d3 (x loaded by the lanes of real tokens) 388.2 against l8u4d3 382.2 in the
// same run; tenth: h8u4d3 (one absmax decode per two tiles) one layer's GEMVs 52.72 / 52.90 us
// against p8u4d3's 54.01 / 54.32 in two runs, decode @512 385.7 vs 384.0: the default; the table
// decode by byte permutes (x/y/z/v8u4d3) 53.3 / 63.5 / 72.9 / 82.4 us: each instruction added per
// tile costs ~0.12 us on 4096x14336 (docs/performance.md, tenth session).
constexpr const char* kSeqDefaultCfg = "h8u4d3";
constexpr const char* kSeqCfgNames =
    "w8u2d4, w8u4d3, w16u2d2, w16u2d4m1, w16u4d3m1; lean: l8u4d3, a8u4d3, p8u4d3, h8u4d3, x8u4d3, y8u4d3, z8u4d3, "
    "v8u4d3";

// The lean kernel (gemv_q4_lean.cuh, ops_gemv_lean.cu): whether it can serve these arguments (x
// fits in shared memory, 32-bit offsets), and its launch for configuration names l... / a...
// (false: no such name).
bool gemv_q4_lean_applies(const Q4SeqArgs& k);
bool gemv_q4_lean(Q4SeqArgs& k, std::string_view cfg, bool bf16, bool dq, cudaStream_t st);
int gemv_q4_lean_warps(std::string_view cfg);  // warps per block of a lean configuration, 0: not one
// The lean kernel on weights in the grouped tile layout (Q4SeqArgs::tile_group, kernel-bench's
// experiment): h8u4d3's T = 1 form with kLeanGrouped; refuses (Error) what it cannot serve.
void gemv_q4_lean_grouped(Q4SeqArgs& k, bool bf16, bool dq, cudaStream_t st);
// The ablated lean kernel (Q4SeqArgs::ablate, kernel-bench's speed-of-light rows; wrong results):
// h8u4d3's T = 1 form, bf16, double quant, whole batches; refuses (Error) anything else.
void gemv_q4_lean_ablated(Q4SeqArgs& k, bool bf16, bool dq, cudaStream_t st);
// The lean kernel over n chained stages in one launch (gemv_q4_lean.cuh, "Chained stages"): the
// configured lean configuration must be one the chain is built for (gemv_q4_chain_cfg: h8u4d3), and
// every stage must fit (x in shared memory, KT a multiple of 32, equal T and block sizes); false
// when not (nothing launched). counters: kGemvChainMaxStages + 1 zeroed, left zeroed. launch =
// false: only whether it would.
bool gemv_q4_chain_cfg(std::string_view cfg);
bool gemv_q4_lean_chain(Q4SeqArgs* st, int n, unsigned* counters, bool bf16, bool dq, cudaStream_t stream,
                        bool launch);
int gemv_num_sms();  // the current device's multiprocessors (cached)

// XS: x staged in shared memory (a.x_stride > 0), else read from global. W warps, U tiles per warp
// per batch, D batches in flight per warp (a register ring: D-1 batches load while one is decoded),
// MINB blocks per SM (the register cap).
template <typename TA, bool DQ, bool XS, int W, int U, int D, int MINB>
__global__ void __launch_bounds__(W * 32, MINB) gemv_q4_seq_kernel(const __grid_constant__ Q4SeqArgs a) {
  extern __shared__ __align__(16) uint32_t lut[];  // [256][64], then x [T][x_stride bytes] if staged
  __shared__ float red[W][16][8];
  __shared__ float gate_v[128];
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];
  __shared__ __align__(16) L2PfLaunch s_pf[kPfLook];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  uint8_t* xs = reinterpret_cast<uint8_t*>(lut) + q4_lut_bytes(2);  // staged x (x_stride > 0)
  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut));
  const uint32_t lane_b = 4u * lane;
  const int64_t KT = a.KT, cols = a.cols, units = a.units, G = gridDim.x;
  const int NB = int((KT + W * U - 1) / (W * U));  // batches per item
  const TA* xrow = static_cast<const TA*>(a.x) + int64_t(min(g, a.T - 1)) * cols + 16 * t;

  // segment and row tile of (unit, sub)
  auto seg_of = [&](int64_t u, int sub, int64_t& rt) { return q4_seq_segment(a, u, sub, rt); };
  auto load = [&](int64_t u, int sub, int b, uint4* wq, float2* s) {
    int64_t rt;
    const Q4StreamSeg& sg = a.seg[seg_of(u, sub, rt)];
    const uint4* tiles = reinterpret_cast<const uint4*>(sg.tiles) + rt * KT * 32;
    const int r = lane & 15;
    int64_t row = rt * 16 + r;
    row = row < sg.rows ? row : sg.rows - 1;
#pragma unroll
    for (int uu = 0; uu < U; ++uu) {
      const int64_t kt = int64_t(b) * W * U + uu * W + warp;
      if (kt < KT) {
        wq[uu] = ld_stream_u4(tiles + kt * 32 + lane);
        const int64_t i = (rt * KT + kt) * 16 + r;
        if constexpr (!DQ) {
          s[uu] = make_float2(__ldg(static_cast<const float*>(sg.absmax) + i), 0.f);
        } else {
          const int64_t blk = (row * cols + kt * 64) >> a.log2_blocksize;
          s[uu] = make_float2(__int_as_float(__ldg(static_cast<const uint8_t*>(sg.absmax) + i)),
                              __ldg(sg.nested_absmax + (blk >> a.log2_nested)));
        }
      } else {
        wq[uu] = make_uint4(0, 0, 0, 0);
        s[uu] = make_float2(0.f, 0.f);
      }
    }
  };
  // a batch position in the block's stream: unit, item (sub) and batch
  struct Cur {
    int64_t u;
    int sub, b;
  };
  auto next = [&](Cur c) {
    if (++c.b == NB) {
      c.b = 0;
      if (++c.sub == a.nsub) {
        c.sub = 0;
        c.u += G;
      }
    }
    return c;
  };

  pdl_trigger();
  if (int64_t(blockIdx.x) >= units) return;
  uint4 wb[D][U];
  float2 sb[D][U];
  // The first D-1 batches' weights and absmax first (they may overlap the previous kernel, PDL),
  // then the tables while they are in flight, then x (written by the previous kernel).
  Cur lc{int64_t(blockIdx.x), 0, 0};
#pragma unroll
  for (int d = 0; d < D - 1; ++d) {
    if (lc.u < units) load(lc.u, lc.sub, lc.b, wb[d], sb[d]);
    lc = next(lc);
  }
  if (tid < 16) s_bits[tid] = bits16<TA>(a.code[tid]);
  if constexpr (DQ) {
    for (int i = tid; i < 256; i += blockDim.x) s_nested_code[i] = a.nested_code[i];
  }
  l2pf_load(a.pf, s_pf);
  __syncthreads();
  if (tid == 0) l2pf_unit(s_pf, blockIdx.x, units);
  q4_fill_lut<64>(lut, s_bits);
  pdl_wait();
  if constexpr (XS) q4_seq_stage_x<TA>(a, xs);
  __syncthreads();
  const uint8_t* xs_l = xs + (XS ? min(g, a.T - 1) * a.x_stride + 32 * t : 0);
  Cur cc{int64_t(blockIdx.x), 0, 0};
  int64_t rt;
  int k = seg_of(cc.u, 0, rt);
  float offset = a.seg[k].offset;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (bool more = true; more;) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      // keep D-1 batches in flight: load into the slot the previous step consumed
      if (lc.u < units) {
        if (tid == 0 && lc.b == 0 && lc.sub == 0) l2pf_unit(s_pf, lc.u, units);
        load(lc.u, lc.sub, lc.b, wb[(d + D - 1) % D], sb[(d + D - 1) % D]);
      }
      lc = next(lc);
#pragma unroll
      for (int uu = 0; uu < U; ++uu) {
        const int64_t kt = int64_t(cc.b) * W * U + uu * W + warp;
        if (kt < KT) {  // warp-uniform
          uint4 xa, xb;
          if constexpr (XS) {
            const uint4* xp = reinterpret_cast<const uint4*>(xs_l + kt * 128);
            xa = xp[0];
            xb = xp[1];
          } else {
            const uint4* xp = reinterpret_cast<const uint4*>(xrow + kt * 64);
            xa = __ldg(xp);
            xb = __ldg(xp + 1);
          }
          q4_tile_scaled<TA, DQ>(lut_s, lane_b, wb[d][uu], xa, xb, sb[d][uu], offset, s_nested_code, g, acc);
        }
      }
      if (cc.b == NB - 1) {
        seq_item_epilogue<TA, W>(a, red, gate_v, acc, k, rt, cc.sub);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = 0.f;
      }
      cc = next(cc);
      if (cc.u >= units) {  // block-uniform
        more = false;
        break;
      }
      if (cc.b == 0) {
        k = seg_of(cc.u, cc.sub, rt);
        offset = a.seg[k].offset;
      }
    }
  }
}

}  // namespace nf4flash::cuda
