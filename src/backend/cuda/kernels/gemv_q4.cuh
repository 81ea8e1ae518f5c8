// The repacked 4-bit weight layout and what reads it outside the decode GEMV: the tile decode
// (code table, mma fragments, absmax), the register-prefetch GEMV (gemv_q4_kernel) and the
// dequantize kernel (q4_dequant8_kernel). bitsandbytes 4-bit weights (NF4/FP4, plain or
// double-quant absmax):
//   out[n, r] = sum_k x[n, k] * code[q(r, k)] * absmax(r, k)  (+ bias[r]),   n < T <= 8 tokens.
// x: [T, cols] bf16/f16 (the compute dtype); out: [T, rows] compute dtype or f32; f32 accumulation.
//
// Repacked layout ("tile16x64", made on the GPU at upload by q4_repack_kernel (ops_gemv_q4.cu) from bitsandbytes'
// flat high-nibble-first packing; needs cols % 64 == 0 and a power-of-two blocksize >= 64):
//   rows are padded to RT = ceil(rows/16) tiles of 16; the 64-column tile kt of row tile rt is
//   512 bytes at offset (rt*KT + kt)*512. Inside it lane L = 4g + t (g = L>>2, t = L&3) owns the
//   16 bytes at L*16, word j (0..3) = { A(g, c), A(g+8, c), A(g, c+1), A(g+8, c+1) } where
//   c = 8t + 2j and A(r, c) is source byte c of row r's 32 bytes in this tile (nibbles unchanged:
//   high = even column). One warp-wide 16-byte load per lane reads a tile: 512 contiguous bytes.
//   Word j is exactly lane L's A fragment of mma.m16n8k16 step j, with the k-slots permuted so
//   that the lane's four steps cover the 16 contiguous columns 64kt + 16t .. +15: the matching B
//   fragment (x) is two 16-byte loads. absmax is stored per (row tile, col tile, row) [RT][KT][16]
//   (f32 for plain, u8 codes for double quant, decoded in the kernel), one 64-byte (16-byte) load.
//
// Decoding: a 256-entry "byte -> two 16-bit codes" table in shared memory, replicated per lane
// ([256][64] words, lane L's copy at word L) so the lookups never conflict on banks: one LDS per
// two weights. The decode GEMV takes one word of each tile through a register copy of the 16 codes
// instead (q4_word_prmt: byte permutes, no LDS). The four mma
// steps of a tile accumulate code*x in f32; the per-row absmax scales the tile's partial sum
// (f32 FMA), so codes are the only values rounded to 16 bits. Columns of the mma are the tokens.
#pragma once
#include <algorithm>
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/kernels/cp_async.cuh"
#include "backend/cuda/kernels/mma.cuh"

namespace nf4flash::cuda {

// The register-prefetch GEMV's configuration (gemv_q4_kernel): 16 warps, 2 tiles per batch, <= 64
// registers (2 blocks per SM), byte_perm addressing into the [256][64] per-lane table. It serves
// 4-bit linears of 9..32 rows in launches of 8 (the decode GEMV, gemv_q4_decode.cuh, serves 1..8).
constexpr int kQ4RegWarps = 16, kQ4RegUnroll = 2, kQ4RegMinBlocks = 2;

template <typename T> __device__ __forceinline__ uint16_t bits16(float v);
template <> __device__ __forceinline__ uint16_t bits16<__nv_bfloat16>(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
template <> __device__ __forceinline__ uint16_t bits16<__half>(float v) {
  return __half_as_ushort(__float2half_rn(v));
}

// One lane's code word (4 bytes) through the byte table at a stride of 64 words per entry
// ([256][64], lane L's copy at word L: conflict-free) so that one byte_perm builds the whole shared
// address, byte * 256 + 4L, from the code byte and lane_b = 4L. lut_s: the table's shared-window
// address. fa[k]: the entry of byte k.
__device__ __forceinline__ void q4_word_lds(uint32_t lut_s, uint32_t lane_b, uint32_t w, uint32_t* fa) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    // result bytes: [lane_b, code byte k, 0, 0] (selector 4 = lane_b's byte 0, 5 = its zero byte 1)
    const uint32_t off = __byte_perm(w, lane_b, 0x5504u | (uint32_t(k) << 4));
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(fa[k]) : "r"(lut_s + off));
  }
}

// The 16 codes as two byte planes in registers (lo[i] byte j = low byte of code 4i + j, hi the
// high bytes), for q4_word_prmt. s_bits: the 16 codes as 16-bit values.
struct Q4RegTable {
  uint32_t lo[4], hi[4];
};
__device__ __forceinline__ Q4RegTable q4_reg_table(const uint32_t* s_bits) {
  Q4RegTable r;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t c01 = s_bits[4 * i] | (s_bits[4 * i + 1] << 16), c23 = s_bits[4 * i + 2] | (s_bits[4 * i + 3] << 16);
    r.lo[i] = __byte_perm(c01, c23, 0x6420);
    r.hi[i] = __byte_perm(c01, c23, 0x7531);
  }
  return r;
}

// q4_word_lds's result from the register table instead of shared memory (no LDS; ~23 ALU
// instructions a word): for each half of w (nibbles n0..n3 = low, high nibble of its first byte,
// then of its second) the low and high bytes of code[n] come from two 8-byte selections (codes
// 0-7, 8-15) and a third picking by bit 3 of n, then interleave into the two entries.
__device__ __forceinline__ void q4_word_prmt(const Q4RegTable& tb, uint32_t w, uint32_t* fa) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t n = w >> (16 * h);
    const uint32_t sel = n & 0x7777u, pick = ((n >> 1) & 0x4444u) | 0x3210u;
    const uint32_t lo = __byte_perm(__byte_perm(tb.lo[0], tb.lo[1], sel), __byte_perm(tb.lo[2], tb.lo[3], sel), pick);
    const uint32_t hi = __byte_perm(__byte_perm(tb.hi[0], tb.hi[1], sel), __byte_perm(tb.hi[2], tb.hi[3], sel), pick);
    fa[2 * h] = __byte_perm(lo, hi, 0x4051u);      // { code[n1], code[n0] }
    fa[2 * h + 1] = __byte_perm(lo, hi, 0x6273u);  // { code[n3], code[n2] }
  }
}

// One tile: the lane's 4 code words, each against its x fragments (one mma.m16n8k16 per word).
// Words 0..PW-1 decode through the register table tb (q4_word_prmt), the rest through the shared
// byte table (q4_word_lds): the same entries either way. d[0..3] += the unscaled partial sums of
// rows g, g+8 x tokens 2t, 2t+1.
template <typename TA, int PW = 0>
__device__ __forceinline__ void q4_tile_mma_prmt(uint32_t lut_s, uint32_t lane_b, const uint4& wq, const uint4& xa,
                                                 const uint4& xb, float* d, const Q4RegTable* tb = nullptr) {
  const uint32_t wv[4] = {wq.x, wq.y, wq.z, wq.w};
  const uint32_t xv[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t fa[4];
    if (j < PW) q4_word_prmt(*tb, wv[j], fa);
    else q4_word_lds(lut_s, lane_b, wv[j], fa);
    mma_16816<TA>(d, fa, xv[2 * j], xv[2 * j + 1]);
  }
}

// The warps' mma accumulators (rows g, g+8 x tokens 2t, 2t+1) into red[warp], then a barrier:
// after it red[w][r][n] holds warp w's partial sum of row r, token n.
template <int W>
__device__ __forceinline__ void q4_publish_acc(float (&red)[W][16][8], const float* acc) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  red[warp][g][2 * t] = acc[0];
  red[warp][g][2 * t + 1] = acc[1];
  red[warp][g + 8][2 * t] = acc[2];
  red[warp][g + 8][2 * t + 1] = acc[3];
  __syncthreads();
}

// End of a row tile: the warps' partial sums are summed over warps in shared memory and rows
// r < 16 x tokens n < T written (+ bias), f32 or the compute dtype. Ends with a barrier so `red`
// may be reused.
template <typename TA, int W>
__device__ __forceinline__ void q4_finish_row_tile(float (&red)[W][16][8], const float* acc, int64_t rt,
                                                   int64_t rows, int T, const float* bias, void* out, int out_f32) {
  q4_publish_acc<W>(red, acc);
  if (threadIdx.x < 128) {
    const int r = threadIdx.x >> 3, n = threadIdx.x & 7;
    const int64_t row = rt * 16 + r;
    if (n < T && row < rows) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < W; ++w) v += red[w][r][n];
      if (bias) v += bias[row];
      if (out_f32) static_cast<float*>(out)[n * rows + row] = v;
      else static_cast<TA*>(out)[n * rows + row] = from_f32<TA>(v);
    }
  }
  __syncthreads();
}

// Epilogue stores of the decode GEMV (gemv_q4_decode.cuh; q4_store_y also stores the MoE weighted
// sums, moe.cuh), element o of an output: SwiGLU from the gate and up values already rounded to the
// compute dtype; a plain result y as f32, as the compute dtype, or added to the residual there
// (rounded first: the unfused result).
template <typename TA>
__device__ __forceinline__ void q4_store_swiglu(void* out, int64_t o, float gv, float uv) {
  static_cast<TA*>(out)[o] = from_f32<TA>(gv / (1.f + __expf(-gv)) * uv);
}
template <typename TA>
__device__ __forceinline__ void q4_store_y(void* out, int64_t o, float y, int out_f32, bool residual) {
  if (out_f32) {
    static_cast<float*>(out)[o] = y;
  } else if (residual) {
    // ld.cg: read through L2 (the residual row is written by the previous kernel)
    TA* p = static_cast<TA*>(out) + o;
    *p = from_f32<TA>(to_f32<TA>(__ldcg(p)) + to_f32<TA>(from_f32<TA>(y)));
  } else {
    static_cast<TA*>(out)[o] = from_f32<TA>(y);
  }
}

// Host side of the launchers with several weights per launch: whether w may share a launch with
// w0 (same columns and quantization parameters: w0's nested code table serves both), and a
// segment's fields from its weight (Seg: Q4DecodeSeg, Q4SkinnySeg).
inline bool q4_same_params(const Q4Device& w, const Q4Device& w0) {
  return w.cols == w0.cols && w.double_quant == w0.double_quant && w.log2_blocksize == w0.log2_blocksize &&
         w.log2_nested == w0.log2_nested && std::equal(w.code, w.code + 16, w0.code);
}
template <typename Seg>
void q4_fill_seg(Seg& q, const Q4Device& w, const float* bias, void* out) {
  q.tiles = w.tiles;
  q.absmax = w.double_quant ? static_cast<const void*>(w.absq_tiled) : static_cast<const void*>(w.absmax_tiled);
  q.nested_absmax = w.nested_absmax;
  q.offset = w.offset;
  q.bias = bias;
  q.out = out;
  q.rows = w.rows;
  q.RT = decltype(q.RT)(w.RT);
}

struct Q4KernelArgs {
  Q4Device w;
  const void* x;
  int T;
  const float* bias;
  void* out;
  int out_f32;
};

// absmax of row (16*rt + r) in column tile kt; r in 0..15. Split in two so the pipelined GEMV
// issues only independent global loads ahead (q4_scale_raw) and decodes later (q4_scale_fin):
// plain: raw = the f32 absmax; double quant: raw = (u8 code, nested absmax) packed in a float2.
template <bool DQ>
__device__ __forceinline__ float2 q4_scale_raw(const Q4Device& w, int64_t rt, int64_t kt, int r) {
  const int64_t i = (rt * w.KT + kt) * 16 + r;
  if constexpr (!DQ) {
    return make_float2(__ldg(w.absmax_tiled + i), 0.f);
  } else {
    int64_t row = rt * 16 + r;
    row = row < w.rows ? row : w.rows - 1;
    const int64_t b = (row * w.cols + kt * 64) >> w.log2_blocksize;
    return make_float2(__int_as_float(__ldg(w.absq_tiled + i)), __ldg(w.nested_absmax + (b >> w.log2_nested)));
  }
}
// The absmax from its raw load: the f32 absmax, or (u8 code, nested absmax) for double quant,
// decoded as bitsandbytes does (product rounded to f32, then the offset added; never fused).
template <bool DQ>
__device__ __forceinline__ float q4_scale_decode(float2 raw, float offset, const float* s_nested_code) {
  if constexpr (DQ) return __fadd_rn(__fmul_rn(s_nested_code[__float_as_int(raw.x)], raw.y), offset);
  else return raw.x;
}
template <bool DQ>
__device__ __forceinline__ float q4_scale_fin(const Q4Device& w, const float* s_nested_code, float2 raw) {
  return q4_scale_decode<DQ>(raw, w.offset, s_nested_code);
}
template <bool DQ>
__device__ __forceinline__ float q4_scale(const Q4Device& w, const float* s_nested_code, int64_t rt, int64_t kt, int r) {
  return q4_scale_fin<DQ>(w, s_nested_code, q4_scale_raw<DQ>(w, rt, kt, r));
}

// Bytes of the per-lane code table ([256][64] words), dynamic shared memory of every 4-bit GEMV.
constexpr int kQ4LutBytes = 256 * 64 * 4;

// The byte -> two codes table, replicated per lane (conflict-free lookups): entry `byte` starts at
// lut + byte * LS words, the 32 lanes' copies in its first 32 words. s_bits: the 16 codes as 16-bit
// values, written before a barrier. The caller syncs after. Thread i writes 16-byte chunks i + k*NT
// (entry chunk >> 3, copies 4 (chunk & 7) ..): a quarter-warp fills one entry's 128 bytes (no bank
// conflict). With NT = blockDim.x known (a multiple of 128), the entry's low-nibble code is the same
// for all k and the offsets are immediates: ~6 instructions per chunk instead of ~21 (the generic
// loop was 7% of a 14336x4096 launch's instructions under ncu).
template <int LS, int NT = 0>
__device__ __forceinline__ void q4_fill_lut(uint32_t* lut, const uint32_t* s_bits) {
  if constexpr (NT > 0) {
    static_assert(NT % 128 == 0 && 2048 % NT == 0, "q4_fill_lut: NT a multiple of 128 dividing 2048");
    const int tid = threadIdx.x;
    const uint32_t lo16 = s_bits[(tid >> 3) & 15] << 16;  // code of the entry's low nibble, high half
    uint4* p = reinterpret_cast<uint4*>(lut + (tid >> 3) * LS) + (tid & 7);
#pragma unroll
    for (int k = 0; k < 2048 / NT; ++k) {
      const uint32_t e = s_bits[(tid >> 7) + k * (NT / 128)] | lo16;
      p[k * (NT / 8) * LS / 4] = make_uint4(e, e, e, e);
    }
  } else {
    for (int i = threadIdx.x; i < 256 * 8; i += blockDim.x) {  // 8 x 16 bytes (32 lanes) per table entry
      const int byte = i >> 3;
      const uint32_t e = s_bits[byte >> 4] | (s_bits[byte & 15] << 16);
      reinterpret_cast<uint4*>(lut + byte * LS)[i & 7] = make_uint4(e, e, e, e);
    }
  }
}

// Block prologue of the register kernel: the 16 codes, the nested code table (double
// quant) and the table of LS words per entry, each behind a barrier.
template <typename TA, bool DQ, int LS>
__device__ __forceinline__ void q4_block_setup(const Q4Device& w, uint32_t* lut, uint32_t* s_bits,
                                               float* s_nested_code) {
  if (threadIdx.x < 16) s_bits[threadIdx.x] = bits16<TA>(w.code[threadIdx.x]);
  if constexpr (DQ) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_nested_code[i] = w.nested_code[i];
  }
  __syncthreads();
  q4_fill_lut<LS>(lut, s_bits);
  __syncthreads();
}

// Software-pipelined register GEMV (T <= 8 tokens, one weight, plain store): block b takes row tiles
// b, b + G, ...; each warp walks its batches (U column tiles, stride W) of the row tile and issues
// the next batch's weight/absmax loads before decoding the current one, across row-tile boundaries
// too. x is read from global memory (L1). Grid: min(RT, resident blocks); W*32 threads; dynamic
// shared memory kQ4LutBytes.
template <typename TA, bool DQ, int W = kQ4RegWarps, int U = kQ4RegUnroll, int MINB = kQ4RegMinBlocks>
__global__ void __launch_bounds__(W * 32, MINB) gemv_q4_kernel(const Q4KernelArgs a) {
  extern __shared__ __align__(16) uint32_t lut[];  // [256][64]
  __shared__ float red[W][16][8];
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];
  q4_block_setup<TA, DQ, 64>(a.w, lut, s_bits, s_nested_code);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut));
  const uint32_t lane_b = 4u * lane;
  const int64_t KT = a.w.KT, cols = a.w.cols, rows = a.w.rows, RT = a.w.RT;
  const int NB = int((KT + W * U - 1) / (W * U));  // batches per row tile
  const TA* xrow = static_cast<const TA*>(a.x) + int64_t(min(g, a.T - 1)) * cols + 16 * t;
  const uint4* tiles = reinterpret_cast<const uint4*>(a.w.tiles);

  auto load = [&](int64_t rt, int b, uint4* wq, float2* s) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t kt = int64_t(b) * W * U + u * W + warp;
      if (kt < KT) {
        wq[u] = ld_stream_u4(tiles + (rt * KT + kt) * 32 + lane);
        s[u] = q4_scale_raw<DQ>(a.w, rt, kt, lane & 15);
      } else {
        wq[u] = make_uint4(0, 0, 0, 0);
        s[u] = make_float2(0.f, 0.f);
      }
    }
  };

  pdl_trigger();
  int64_t rt = blockIdx.x;
  if (rt >= RT) return;
  uint4 wc[U];
  float2 sc[U];
  load(rt, 0, wc, sc);  // weights and absmax only: may overlap the previous kernel (PDL)
  pdl_wait();
  for (;;) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int b = 0; b < NB; ++b) {
      int64_t nrt = rt;
      int nb = b + 1;
      if (nb == NB) { nrt = rt + gridDim.x; nb = 0; }
      uint4 wn[U];
      float2 sn[U];
      if (nrt < RT) load(nrt, nb, wn, sn);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kt = int64_t(b) * W * U + u * W + warp;
        if (kt < KT) {  // warp-uniform
          const uint4* xp = reinterpret_cast<const uint4*>(xrow + kt * 64);
          const uint4 xa = __ldg(xp), xb = __ldg(xp + 1);
          const float sv = q4_scale_fin<DQ>(a.w, s_nested_code, sc[u]);
          const float sg = __shfl_sync(0xffffffffu, sv, g);
          const float sg8 = __shfl_sync(0xffffffffu, sv, g + 8);
          float d[4] = {0.f, 0.f, 0.f, 0.f};
          q4_tile_mma_prmt<TA>(lut_s, lane_b, wc[u], xa, xb, d);
          acc[0] = fmaf(d[0], sg, acc[0]);
          acc[1] = fmaf(d[1], sg, acc[1]);
          acc[2] = fmaf(d[2], sg8, acc[2]);
          acc[3] = fmaf(d[3], sg8, acc[3]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        wc[u] = wn[u];
        sc[u] = sn[u];
      }
    }
    q4_finish_row_tile<TA, W>(red, acc, rt, rows, a.T, a.bias, a.out, a.out_f32);
    rt += gridDim.x;
    if (rt >= RT) break;
  }
}

// Inverse of the layout, coalesced: one thread per (row, 8 consecutive columns) reads the two
// 4-byte words of the tile that hold them (one 8-byte load) and writes 8 values (16 bytes for
// bf16/f16, 32 for f32). Thread (r, cg): tile (r/16, cg/8), m = cg%8 -> source bytes 4m..4m+3 of
// the row in this tile = words j0 = 2(m%2), j0+1 of lane 4(r%8) + m/2, byte 2e + (r%16)/8.
// The 16 codes go to shared memory first: indexing the kernel parameter with per-lane values
// serializes on the constant cache (up to 16 ways per lookup).
// Rows [row0, row0 + nrows) only (the chunked prefill path), written from out[0].
template <typename TO, bool DQ>
__global__ void q4_dequant8_kernel(const Q4Device w, int64_t row0, int64_t nrows, TO* __restrict__ out) {
  __shared__ float s_nested_code[256];
  __shared__ float s_code[16];
  if constexpr (DQ) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_nested_code[i] = w.nested_code[i];
  }
  if (threadIdx.x < 16) s_code[threadIdx.x] = w.code[threadIdx.x];
  __syncthreads();
  const int64_t groups = w.cols / 8, total = nrows * groups;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  int64_t row, cg;
  if (total < (int64_t(1) << 32)) {  // 32-bit division when it fits
    const uint32_t i32 = uint32_t(i), g32 = uint32_t(groups);
    row = i32 / g32;
    cg = i32 - uint32_t(row) * g32;
  } else {
    row = i / groups;
    cg = i % groups;
  }
  TO* o = out + row * w.cols + cg * 8;
  row += row0;
  const int64_t kt = cg >> 3, rt = row >> 4;
  const int m = int(cg & 7), rr = int(row & 15), lane = 4 * (rr & 7) + (m >> 1), hi = rr >> 3;
  const uint2 wd = *reinterpret_cast<const uint2*>(w.tiles + (rt * w.KT + kt) * 512 + lane * 16 + (m & 1) * 8);
  const float s = q4_scale<DQ>(w, s_nested_code, rt, kt, rr);
  float v[8];
  const uint32_t words[2] = {wd.x, wd.y};
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const uint32_t byte = (words[j] >> (8 * (2 * e + hi))) & 0xffu;
      v[4 * j + 2 * e] = s_code[byte >> 4] * s;
      v[4 * j + 2 * e + 1] = s_code[byte & 15] * s;
    }
  if constexpr (sizeof(TO) == 2) {
    uint4 pk;
    TO* h = reinterpret_cast<TO*>(&pk);
#pragma unroll
    for (int k = 0; k < 8; ++k) h[k] = from_f32<TO>(v[k]);
    *reinterpret_cast<uint4*>(o) = pk;
  } else {
    reinterpret_cast<float4*>(o)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(o)[1] = make_float4(v[4], v[5], v[6], v[7]);
  }
}

}  // namespace nf4flash::cuda
