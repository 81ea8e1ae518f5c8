// The 4-bit decode GEMV: up to three weights sharing x, in order, with fused epilogues.
//
//   out_s[n, r] = epilogue( sum_k x[n, k] * code[q_s(r, k)] * absmax_s(r, k) + bias_s[r] ),  n < T <= 8
//
// Weights: the tile16x64 layout of gemv_q4.cuh (512 bytes of codes per 16 rows x 64 columns, row
// tile rt's KT tiles contiguous), absmax [RT][KT][16] (f32, or u8 codes + nested f32 absmax for
// double quant, decoded as bitsandbytes does). x: [T, cols] bf16/f16; f32 accumulation. Epilogues:
//   Store    : out_s [T, rows_s] = x W_s^T + b_s      (q, k and v in one launch)
//   Residual : out   [T, rows]  += round(x W^T + b)   (o_proj / down_proj with the residual add)
//   SwiGLU   : out   [T, rows]   = silu(round(x G^T + bg)) * round(x U^T + bu), rounded
// With norm_w, x is first replaced by rms_norm(x) * norm_w (norm_prologue.cuh: rms_norm's exact
// arithmetic), so the layer's norms need no launch of their own.
//
// Work: a unit is one row tile of the concatenated segments (Store/Residual), or one gate row tile
// followed by the same up row tile (SwiGLU, nsub = 2), one "item" each; block b takes units b,
// b + G, ... in order. Inside an item warp w takes column tiles w + W*i in batches of U tiles
// (stride W) and keeps D-1 batches of weights in flight in a register ring, across item and unit
// boundaries. Reduction per item: the warps' mma accumulators (rows g, g+8 x tokens 2t, 2t+1) are
// summed in shared memory, then 128 threads (16 rows x 8 tokens) run the epilogue; SwiGLU keeps the
// rounded gate values in shared memory for the up item.
//
// Two kernels:
//   gemv_q4_decode_kernel     x staged in shared memory beside the code table (T * (2 cols + 16)
//                             bytes at most kDecodeXMax): every decode step's GEMVs. Per tile ~100
//                             instructions: code word 0 through the register table (~23 ALU),
//                             words 1-3 through the shared one (12 byte_perm + 12 LDS), 2 LDS.128 for x
//                             (loaded only by the lanes whose mma column is a real token), 4 HMMA,
//                             the scale (lanes 0-15 load and decode the absmax of a batch's even
//                             tiles, 16-31 of its odd ones), the next batch's loads; 32-bit running
//                             offsets per item; no per-tile bounds tests when KT % (W*U) == 0 (FULL).
//                             T1: one token, token column 1's accumulators are never scaled.
//   gemv_q4_decode_gx_kernel  the same work order and arithmetic with x read from global memory
//                             (L1): the rows where x does not fit in shared memory (several tokens
//                             of a 14336-column down_proj) or 32-bit offsets would overflow. No norm.
#pragma once
#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/kernels/norm_prologue.cuh"

namespace nf4flash::cuda {

constexpr int kDecodeW = 8, kDecodeU = 4, kDecodeD = 3, kDecodeMinBlocks = 2;  // warps, tiles/batch, batches in flight
constexpr int kDecodeXMax = 38 * 1024;  // x staged beside the 64 KB table at 2 blocks per SM
// Code words of each tile decoded through the register table (q4_word_prmt) instead of the shared
// one: 16 - 4 PW table loads a tile, ~19 more ALU instructions a word so decoded.
constexpr int kDecodePrmtWords = 1;

struct Q4DecodeSeg {
  const uint8_t* tiles;
  const void* absmax;          // f32 [RT][KT][16], or u8 codes (double quant)
  const float* nested_absmax;  // double quant
  float offset;                // double quant
  const float* bias;           // [rows] or null
  void* out;                   // [T, rows]: Store / SwiGLU (segment 0) / Residual (in place)
  int64_t rows, RT;
};

struct Q4DecodeArgs {
  Q4DecodeSeg seg[kGemvMaxSegs];
  int64_t unit_end[kGemvMaxSegs];  // Store/Residual: cumulative row tiles of segments 0..k
  float code[16];
  const float* nested_code;
  int64_t cols, KT, units;
  int log2_blocksize, log2_nested;
  int nseg, nsub, T, out_f32, ep;
  const void* x;
  int x_stride;          // gemv_q4_decode_kernel: rows of staged x, bytes
  const float* norm_w;   // gemv_q4_decode_kernel: x = rms_norm(x) * norm_w first (f32 [cols]); null: none
  float norm_eps;
};

// Bytes of the shared byte table gemv_q4_decode_kernel<..., PW> reads: none when every code word
// decodes in registers.
__host__ __device__ constexpr int decode_lut_bytes(int pw) { return pw < 4 ? kQ4LutBytes : 0; }

// Row stride of x staged in shared memory (16 bytes of padding: rows of different tokens start on
// different banks).
__host__ __device__ constexpr int decode_x_stride(int64_t cols) { return int(cols * 2 + 16); }

// The kernel arguments of a launch (ops_gemv_q4.cu; x_stride is set by the launcher): every segment
// like segment 0, SwiGLU = gate and up of equal rows. Errors name what does not fit.
Q4DecodeArgs gemv_q4_decode_kernel_args(const GemvQ4DecodeArgs& g);

// Segment and row tile of (unit u, sub) (SwiGLU: the sub picks gate or up; else the segment whose
// cumulative row tiles hold u). I: the caller's index type.
template <typename I>
__device__ __forceinline__ int q4_decode_segment(const Q4DecodeArgs& a, I u, int sub, I& rt) {
  if (a.nsub == 2) {
    rt = u;
    return sub;
  }
  int k = 0;
  while (k + 1 < a.nseg && u >= I(a.unit_end[k])) ++k;
  rt = u - (k ? I(a.unit_end[k - 1]) : I(0));
  return k;
}

// One output of an item, by thread tid < 128 (row rt*16 + tid/8, token tid%8): y = the item's sum
// (bias not added) through the epilogue; SwiGLU: sub 0 parks the rounded gate value in gate_v[tid],
// sub 1 stores silu(gate) * up.
template <typename TA>
__device__ __forceinline__ void decode_item_out(const Q4DecodeArgs& a, int k, int64_t rt, int sub, int tid, float y,
                                                float* gate_v) {
  const Q4DecodeSeg& sg = a.seg[k];
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

// The end of one item (row tile rt of segment k; SwiGLU: sub 0 = gate, 1 = up): the warps' mma
// accumulators summed in shared memory (a barrier), then 128 threads run the epilogue. END_SYNC:
// ends with a barrier (red and gate_v may be reused); without it the caller alternates two red
// buffers (the next item's barrier orders the reuse).
template <typename TA, int W, bool END_SYNC>
__device__ __forceinline__ void decode_item_epilogue(const Q4DecodeArgs& a, float (&red)[W][16][8], float* gate_v,
                                                     const float* acc, int k, int64_t rt, int sub) {
  q4_publish_acc<W>(red, acc);
  if (threadIdx.x < 128) {
    const int o = threadIdx.x;
    float y = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) y += red[w][o >> 3][o & 7];
    decode_item_out<TA>(a, k, rt, sub, o, y, gate_v);
  }
  if constexpr (END_SYNC) __syncthreads();
}

// One tile: the lane's 16 code bytes against its x fragments (mma), the partial sums of rows g,
// g + 8 scaled by the absmax held by lanes src0, src8 (sv: each lane's decoded absmax) and added to
// acc. T1: one token: the accumulators of token column 1 (acc[1], acc[3]) are never stored, so they
// are not scaled and added.
template <typename TA, bool T1 = false, int PW = 0>
__device__ __forceinline__ void q4_tile_apply(uint32_t lut_s, uint32_t lane_b, const uint4& wq, const uint4& xa,
                                              const uint4& xb, float sv, int src0, int src8, float* acc,
                                              const Q4RegTable* tb = nullptr) {
  const float s0 = __shfl_sync(0xffffffffu, sv, src0);
  const float s8 = __shfl_sync(0xffffffffu, sv, src8);
  float dd[4] = {0.f, 0.f, 0.f, 0.f};
  q4_tile_mma_prmt<TA, PW>(lut_s, lane_b, wq, xa, xb, dd, tb);
  acc[0] = fmaf(dd[0], s0, acc[0]);
  acc[2] = fmaf(dd[2], s8, acc[2]);
  if constexpr (!T1) {
    acc[1] = fmaf(dd[1], s0, acc[1]);
    acc[3] = fmaf(dd[3], s8, acc[3]);
  }
}

// x staged in shared memory. Grid: min(units, 2 blocks per SM); 256 threads; dynamic shared memory
// decode_lut_bytes(PW) + T * x_stride. PW: code words of a tile decoded through the register table
// (q4_tile_mma_prmt); the backend runs PW = kDecodePrmtWords, the kernel benchmark's decode-form
// rows the others.
template <typename TA, bool DQ, bool FULL, bool T1, int PW = kDecodePrmtWords>
__global__ void __launch_bounds__(kDecodeW * 32, kDecodeMinBlocks) gemv_q4_decode_kernel(const __grid_constant__ Q4DecodeArgs a) {
  constexpr int W = kDecodeW, U = kDecodeU, D = kDecodeD, WU = W * U;
  constexpr int US = U / 2;  // scale loads per lane and batch: one per pair of tiles
  constexpr int kLut = decode_lut_bytes(PW);
  extern __shared__ __align__(16) uint32_t lut[];  // [256][64] (unless kLut = 0), then x [T][x_stride bytes]
  __shared__ float red[2][W][16][8];  // two buffers: one barrier per item (item & 1)
  __shared__ float gate_v[128];
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];
  __shared__ float s_part[kGemvMaxRows][8];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3, r = lane & 15;
  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut));
  const uint32_t lane_b = 4u * lane;
  const int G = gridDim.x;
  const int nsh = a.log2_blocksize + a.log2_nested;
  const int KT = int(a.KT), NB = (KT + WU - 1) / WU, units = int(a.units);  // NB: batches per item

  // load cursor: (unit, sub, batch) and the running offsets of its item
  int lu = blockIdx.x, lsub = 0, lb = 0;
  const uint4* lw = nullptr;    // this lane's 16 bytes of the warp's first tile of the batch
  const uint8_t* la = nullptr;  // absmax of row r (u8 or f32), same tile
  const float* lnest = nullptr;
  uint32_t lo = 0;  // DQ: row * cols + 64 * kt of the batch's first tile
  auto start_item = [&]() {
    int rt;
    const Q4DecodeSeg& sg = a.seg[q4_decode_segment(a, lu, lsub, rt)];
    const uint32_t kt0 = uint32_t(warp);
    const size_t tile0 = size_t(uint32_t(rt) * uint32_t(KT) + kt0);
    lw = reinterpret_cast<const uint4*>(sg.tiles) + tile0 * 32 + lane;
    la = static_cast<const uint8_t*>(sg.absmax) + (tile0 * 16 + r) * (DQ ? 1 : 4);
    lnest = sg.nested_absmax;
    int row = rt * 16 + r;
    row = row < int(sg.rows) ? row : int(sg.rows) - 1;
    lo = uint32_t(row) * uint32_t(a.cols) + 64u * kt0;
  };
  auto advance_load = [&]() {
    if (++lb == NB) {
      lb = 0;
      if (++lsub == a.nsub) {
        lsub = 0;
        lu += G;
      }
      if (lu < units) start_item();
    } else {
      lw += WU * 32;
      la += WU * 16 * (DQ ? 1 : 4);
      lo += 64u * WU;
    }
  };
  // this lane's tile within each pair of the batch (its absmax offsets)
  const int hsel = lane >> 4;
  const uint32_t h_abs = uint32_t(hsel * W * 16 * (DQ ? 1 : 4)), h_lo = uint32_t(64 * hsel * W);
  // the batch at the load cursor into ring slot (wq, s): s.x = u8 code (DQ) or f32 absmax, s.y = nested absmax
  auto load = [&](uint4* wq, float2* s) {
#pragma unroll
    for (int uu = 0; uu < U; ++uu) {
      bool ok = true;
      if constexpr (!FULL) ok = lb * WU + uu * W + warp < KT;
      wq[uu] = ok ? ld_stream_u4(lw + uu * W * 32) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int p = 0; p < US; ++p) {
      const int tu = 2 * p;  // + hsel: the lane's tile
      bool ok = true;
      if constexpr (!FULL) ok = lb * WU + (tu + hsel) * W + warp < KT;
      if (ok) {
        const uint8_t* ap = la + h_abs;
        if constexpr (DQ) {
          s[p] = make_float2(__int_as_float(__ldg(ap + tu * W * 16)), __ldg(lnest + ((lo + h_lo + 64u * tu * W) >> nsh)));
        } else {
          s[p] = make_float2(__ldg(reinterpret_cast<const float*>(ap) + tu * W * 16), 0.f);
        }
      } else {
        s[p] = make_float2(0.f, 0.f);  // scale 0: the tile adds nothing
      }
    }
  };

  pdl_trigger();
  if (int(blockIdx.x) >= units) return;
  // Loads of what no previous kernel writes and the prologue waits for go out first, before the
  // weight stream they would otherwise queue behind (ncu at T=1: the nested code table's load was
  // 16% of a launch's stall samples, the norm weights' another 6%): the nested code table into
  // registers, the norm weights into L1 (prefetch).
  constexpr int NCT = (256 + W * 32 - 1) / (W * 32);
  float ncode[NCT];
  if constexpr (DQ) {
#pragma unroll
    for (int j = 0; j < NCT; ++j)
      if (tid + j * W * 32 < 256) ncode[j] = __ldg(a.nested_code + tid + j * W * 32);
  }
  if (a.norm_w) {
    for (int i = tid; i < int(a.cols) / 32; i += W * 32)  // 128-byte lines of the f32 weights
      asm volatile("prefetch.global.L1 [%0];" ::"l"(a.norm_w + 32 * i));
  }
  uint4 wb[D][U];
  float2 sb[D][US];
  start_item();
  // the first D-1 batches' weights (they may overlap the previous kernel, PDL), then the tables
  // while they are in flight, then x (written by the previous kernel)
#pragma unroll
  for (int d = 0; d < D - 1; ++d) {
    if (lu < units) load(wb[d], sb[d]);
    advance_load();
  }
  if (tid < 16) s_bits[tid] = bits16<TA>(a.code[tid]);
  __syncthreads();
  if constexpr (kLut > 0) q4_fill_lut<64, W * 32>(lut, s_bits);
  const Q4RegTable tb = q4_reg_table(s_bits);
  if constexpr (DQ) {  // read after the barrier that follows the x staging
#pragma unroll
    for (int j = 0; j < NCT; ++j)
      if (tid + j * W * 32 < 256) s_nested_code[tid + j * W * 32] = ncode[j];
  }
  pdl_wait();
  uint8_t* xs = reinterpret_cast<uint8_t*>(lut) + kLut;
  // x, with the norm folded (ends with a barrier)
  stage_rms_norm_x<TA>(a.x, a.T, a.cols, a.x_stride, a.norm_w, a.norm_eps, xs, s_part);
  // this lane's x: token min(g, T-1), columns 64 kt + 16 t .. +15. Only lanes g < T load (1-2
  // shared wavefronts per 16-byte load instead of 4); the others keep the last (finite) values,
  // which only reach the never-stored columns.
  const uint8_t* xs_l = xs + min(g, a.T - 1) * a.x_stride + 32 * t + 128 * warp;
  const bool x_load = g < a.T;
  uint4 xa = make_uint4(0, 0, 0, 0), xb = make_uint4(0, 0, 0, 0);

  // compute cursor: (unit, sub, batch), the item's segment and row tile
  int cu = blockIdx.x, csub = 0, cb = 0, crt = 0;
  int ck = q4_decode_segment(a, cu, csub, crt);
  float offset = a.seg[ck].offset;
  int item = 0;  // items finished by this block (red buffer item & 1)
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (bool more = true; more;) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      // keep D-1 batches in flight: load into the slot the previous step consumed
      if (lu < units) load(wb[(d + D - 1) % D], sb[(d + D - 1) % D]);
      advance_load();
      const uint8_t* xb_addr = xs_l + cb * (WU * 128);
      float sv_pair = 0.f;
#pragma unroll
      for (int uu = 0; uu < U; ++uu) {
        bool ok = true;
        if constexpr (!FULL) ok = cb * WU + uu * W + warp < KT;
        if (ok) {  // warp-uniform
          if (x_load) {
            const uint4* xp = reinterpret_cast<const uint4*>(xb_addr + uu * W * 128);
            xa = xp[0];
            xb = xp[1];
          }
          // the pair's absmax, decoded once at its even tile: lanes 0-15 hold the even tile's
          // rows, 16-31 the odd one's (an odd tile is valid only where its even one is)
          if ((uu & 1) == 0) sv_pair = q4_scale_decode<DQ>(sb[d][uu / 2], offset, s_nested_code);
          const int src = g + 16 * (uu & 1);
          q4_tile_apply<TA, T1, PW>(lut_s, lane_b, wb[d][uu], xa, xb, sv_pair, src, src + 8, acc, &tb);
        }
      }
      if (++cb == NB) {
        decode_item_epilogue<TA, W, false>(a, red[item & 1], gate_v, acc, ck, crt, csub);
        ++item;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = 0.f;
        cb = 0;
        if (++csub == a.nsub) {
          csub = 0;
          cu += G;
        }
        if (cu >= units) {  // block-uniform: this block's share is done
          more = false;
          break;
        }
        ck = q4_decode_segment(a, cu, csub, crt);
        offset = a.seg[ck].offset;
      }
    }
  }
}

// x read from global memory. Grid: min(units, resident blocks); 256 threads; dynamic shared memory
// kQ4LutBytes.
template <typename TA, bool DQ>
__global__ void __launch_bounds__(kDecodeW * 32, kDecodeMinBlocks) gemv_q4_decode_gx_kernel(const __grid_constant__ Q4DecodeArgs a) {
  constexpr int W = kDecodeW, U = kDecodeU, D = kDecodeD;
  extern __shared__ __align__(16) uint32_t lut[];  // [256][64]
  __shared__ float red[W][16][8];
  __shared__ float gate_v[128];
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut));
  const uint32_t lane_b = 4u * lane;
  const int64_t KT = a.KT, cols = a.cols, units = a.units, G = gridDim.x;
  const int NB = int((KT + W * U - 1) / (W * U));  // batches per item
  const TA* xrow = static_cast<const TA*>(a.x) + int64_t(min(g, a.T - 1)) * cols + 16 * t;

  auto load = [&](int64_t u, int sub, int b, uint4* wq, float2* s) {
    int64_t rt;
    const Q4DecodeSeg& sg = a.seg[q4_decode_segment(a, u, sub, rt)];
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
  // then the tables while they are in flight.
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
  __syncthreads();
  q4_fill_lut<64>(lut, s_bits);
  pdl_wait();
  __syncthreads();
  Cur cc{int64_t(blockIdx.x), 0, 0};
  int64_t rt;
  int k = q4_decode_segment(a, cc.u, 0, rt);
  float offset = a.seg[k].offset;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (bool more = true; more;) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      // keep D-1 batches in flight: load into the slot the previous step consumed
      if (lc.u < units) load(lc.u, lc.sub, lc.b, wb[(d + D - 1) % D], sb[(d + D - 1) % D]);
      lc = next(lc);
#pragma unroll
      for (int uu = 0; uu < U; ++uu) {
        const int64_t kt = int64_t(cc.b) * W * U + uu * W + warp;
        if (kt < KT) {  // warp-uniform
          const uint4* xp = reinterpret_cast<const uint4*>(xrow + kt * 64);
          const uint4 xa = __ldg(xp), xb = __ldg(xp + 1);
          q4_tile_apply<TA>(lut_s, lane_b, wb[d][uu], xa, xb, q4_scale_decode<DQ>(sb[d][uu], offset, s_nested_code),
                            g, g + 8, acc);
        }
      }
      if (cc.b == NB - 1) {
        decode_item_epilogue<TA, W, true>(a, red, gate_v, acc, k, rt, cc.sub);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = 0.f;
      }
      cc = next(cc);
      if (cc.u >= units) {  // block-uniform
        more = false;
        break;
      }
      if (cc.b == 0) {
        k = q4_decode_segment(a, cc.u, cc.sub, rt);
        offset = a.seg[k].offset;
      }
    }
  }
}

}  // namespace nf4flash::cuda
