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
#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/kernels/l2_prefetch.cuh"

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
};

// Row stride of x staged in shared memory (16 bytes of padding: rows of different tokens start on
// different banks).
__host__ __device__ constexpr int seq_x_stride(int64_t cols) { return int(cols * 2 + 16); }

constexpr int kSeqWarps = 16, kSeqUnroll = 2, kSeqMinBlocks = 2;

// XS: x staged in shared memory (a.x_stride > 0), else read from global.
template <typename TA, bool DQ, bool XS, int W = kSeqWarps, int U = kSeqUnroll, int MINB = kSeqMinBlocks>
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
  auto seg_of = [&](int64_t u, int sub, int64_t& rt) -> int {
    if (a.nsub == 2) { rt = u; return sub; }
    int k = 0;
    while (k + 1 < a.nseg && u >= a.unit_end[k]) ++k;
    rt = u - (k ? a.unit_end[k - 1] : 0);
    return k;
  };
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

  pdl_trigger();
  int64_t u = blockIdx.x;
  if (u >= units) return;
  int sub = 0;
  uint4 wc[U];
  float2 sc[U];
  // The first batch's weights and absmax first (they may overlap the previous kernel, PDL), then
  // the tables while they are in flight, then x (written by the previous kernel) into shared memory.
  load(u, 0, 0, wc, sc);
  if (tid < 16) s_bits[tid] = bits16<TA>(a.code[tid]);
  if constexpr (DQ) {
    for (int i = tid; i < 256; i += blockDim.x) s_nested_code[i] = a.nested_code[i];
  }
  l2pf_load(a.pf, s_pf);
  __syncthreads();
  if (tid == 0) l2pf_unit(s_pf, u, units);
  q4_fill_lut<64>(lut, s_bits);
  pdl_wait();
  if constexpr (XS) {
    const int n16 = int(cols / 8);
    for (int i = tid; i < a.T * n16; i += blockDim.x) {
      const int n = i / n16, c = i - n * n16;
      *reinterpret_cast<uint4*>(xs + n * a.x_stride + c * 16) =
          __ldg(reinterpret_cast<const uint4*>(static_cast<const TA*>(a.x) + int64_t(n) * cols) + c);
    }
  }
  __syncthreads();
  const uint8_t* xs_l = xs + (XS ? min(g, a.T - 1) * a.x_stride + 32 * t : 0);
  for (;;) {
    int64_t rt;
    const int k = seg_of(u, sub, rt);
    const float offset = a.seg[k].offset;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int b = 0; b < NB; ++b) {
      // the next batch: same item, next item of the unit, or the block's next unit
      int64_t nu = u;
      int nsub = sub, nb = b + 1;
      if (nb == NB) {
        nb = 0;
        if (++nsub == a.nsub) {
          nsub = 0;
          nu = u + G;
        }
      }
      uint4 wn[U];
      float2 sn[U];
      if (nu < units) {
        if (tid == 0 && nu != u) l2pf_unit(s_pf, nu, units);
        load(nu, nsub, nb, wn, sn);
      }
#pragma unroll
      for (int uu = 0; uu < U; ++uu) {
        const int64_t kt = int64_t(b) * W * U + uu * W + warp;
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
          float sv = sc[uu].x;
          if constexpr (DQ) sv = __fadd_rn(__fmul_rn(s_nested_code[__float_as_int(sc[uu].x)], sc[uu].y), offset);
          const float sg = __shfl_sync(0xffffffffu, sv, g);
          const float sg8 = __shfl_sync(0xffffffffu, sv, g + 8);
          float d[4] = {0.f, 0.f, 0.f, 0.f};
          q4_tile_mma_prmt<TA, 2>(lut_s, lane_b, wc[uu], xa, xb, d);
          acc[0] = fmaf(d[0], sg, acc[0]);
          acc[1] = fmaf(d[1], sg, acc[1]);
          acc[2] = fmaf(d[2], sg8, acc[2]);
          acc[3] = fmaf(d[3], sg8, acc[3]);
        }
      }
#pragma unroll
      for (int uu = 0; uu < U; ++uu) {
        wc[uu] = wn[uu];
        sc[uu] = sn[uu];
      }
    }
    // the item's epilogue
    red[warp][g][2 * t] = acc[0];
    red[warp][g][2 * t + 1] = acc[1];
    red[warp][g + 8][2 * t] = acc[2];
    red[warp][g + 8][2 * t + 1] = acc[3];
    __syncthreads();
    if (tid < 128) {
      const Q4StreamSeg& sg = a.seg[k];
      const int r = tid >> 3, n = tid & 7;
      const int64_t row = rt * 16 + r;
      if (n < a.T && row < sg.rows) {
        float y = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) y += red[w][r][n];
        if (sg.bias) y += sg.bias[row];
        if (a.ep == int(GemvEpilogue::SwiGLU)) {
          const float yr = to_f32<TA>(from_f32<TA>(y));
          if (sub == 0) {
            gate_v[tid] = yr;
          } else {
            const float gv = gate_v[tid];
            static_cast<TA*>(a.seg[0].out)[int64_t(n) * sg.rows + row] = from_f32<TA>(gv / (1.f + __expf(-gv)) * yr);
          }
        } else {
          const int64_t o = int64_t(n) * sg.rows + row;
          if (a.out_f32) {
            static_cast<float*>(sg.out)[o] = y;
          } else if (a.ep == int(GemvEpilogue::Residual)) {
            TA* p = static_cast<TA*>(sg.out) + o;
            *p = from_f32<TA>(to_f32<TA>(*p) + to_f32<TA>(from_f32<TA>(y)));
          } else {
            static_cast<TA*>(sg.out)[o] = from_f32<TA>(y);
          }
        }
      }
    }
    __syncthreads();
    if (++sub == a.nsub) {
      sub = 0;
      u += G;
      if (u >= units) break;
    }
  }
}

}  // namespace nf4flash::cuda
