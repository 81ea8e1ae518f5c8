// Flash-decoding on tensor cores: attn_decode_mma_kernel (mma.sync m16n8k16, f32 accumulation).
//
// Same grid, sequence slices, workspace partials (m, l, acc[hd] per split) and combine launch as
// attn_decode_kernel (attention.cuh), for a KV cache in the compute dtype T (bf16 or f16).
//   grid (n_kv * hchunks, nsplit, T), 128 threads; a block takes up to GH q heads of one kv head
//   (GH = 8, or 16 when G > 8: rows g and g+8 of the mma) of token t over the slice [s0, s1).
//   Warp w takes tiles of 16 cache positions: tile i covers s0 + 16 (4 i + w) .. +15 (with
//   NF4FLASH_DECODE_ORDER=interleave the block steps of 64 positions of the active splits
//   interleave instead: decode_span in attention.cuh).
//     S = Q K^T   A = Q [16 rows = heads (zero past the block's heads), k = head dims] as bf16/f16
//                 exactly as stored, B = K^T (one n-tile = 8 positions, two per tile), HD/16 k-steps;
//                 S * scale * log2(e) in f32, positions past the slice -> -inf
//     online softmax per row (log2 domain): row max over the 4 lanes of a row, l kept per lane and
//                 summed over the row's lanes at the end
//     O += P V    A = P taken from S's accumulators (rows = heads, k = the tile's 16 positions),
//                 B = V (one n-tile = 8 head dims, HD/8 n-tiles), O in f32 registers
//   Head dims are permuted consistently inside each product so that a lane loads whole 16-byte
//   runs (lane g = lane/4, tq = lane%4):
//     S k-step ks uses dims 32 (ks/2) + 8 tq + 4 (ks%2) + {0,1} (k = 2tq, 2tq+1) and + {2,3}
//       (k = 2tq+8, 2tq+9): the lane's K bytes are dims 32 m + 8 tq .. +7 of position 8 nt + g;
//     O n-tile j column n is dim (HD/8) n + j: the lane's V bytes are dims (HD/8) g .. +HD/8-1 of
//       positions 2tq, 2tq+1, 2tq+8, 2tq+9, paired per dim by byte permutes into B fragments.
//   Each thread's K/V bytes go through its own cp.async ring of 2 tiles in shared memory
//   ([2][16-byte copies per tile: HD/16 K + HD/16 V][128 threads], 64 KB at HD 128): the next
//   tile is in flight while one is summed. The ring is reused for the warps' merge at the end.
// Against the CUDA-core kernel (attention.cuh): ~10x fewer instructions per cache byte; the
// softmax weights P are rounded to T before P V (as in FlashAttention-2). Opt-in
// (NF4FLASH_DECODE_KERNEL=mma): on the H200 it measured slower than the CUDA-core kernel with its
// K/V ring (ctx 32768: 69.7 vs 62.6 us per layer; ctx 512: 11.7 vs 9.0 us; docs/performance.md).
// Each warp has one 8 KB tile in flight while it works through a dependent chain (8 mma for S,
// the row max across lanes, exp2, 16 mma for P V) with only 12 warps per SM.
#pragma once
#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/mma.cuh"

namespace nf4flash::cuda {

template <int HD>
constexpr int attn_decode_mma_smem() {
  constexpr int ring = 2 * (HD / 8) * 128 * 16;            // [2][HD/16 + HD/16][128] x 16 bytes
  constexpr int merge = (4 * 16 * HD + 4 * 16 * 2) * 4;    // s_acc [4][16][HD] + s_ml [4][16][2]
  return ring > merge ? ring : merge;
}

template <typename T>
__device__ __forceinline__ uint32_t ld_pair(const T* p) {  // two 16-bit values, p[0] in the low half
  const uint16_t* u = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(u[0]) | (uint32_t(u[1]) << 16);
}

template <typename T, int HD, bool R2>
__global__ void __launch_bounds__(128, 3) attn_decode_mma_kernel(const AttnArgs a, int nsplit, int hchunks) {
  pdl_trigger();
  pdl_wait();
  constexpr int NW = 4, GH = R2 ? 16 : 8;
  constexpr int KS = HD / 16;   // S k-steps
  constexpr int NT = HD / 8;    // O n-tiles
  constexpr int DPL = HD / 8;   // V dims per lane and position
  constexpr int KM = HD / 32;   // K copies per lane and n-tile
  constexpr int VM = HD / 64;   // V copies per lane and position
  constexpr int NC = 2 * KM + 4 * VM;  // copies per thread and tile
  constexpr int RS = 2;
  extern __shared__ uint4 dsm[];
  const DecodeBlock db = decode_block(a, nsplit, hchunks, GH);
  if (!db.active()) return;  // inactive split (whole block)
  const int kvh = db.kvh, h0 = db.h0, nh = db.nh, t = db.t, split = db.split;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  const float qs = a.scale * kLog2e;

  // Q as A fragments: rows g and g+8 are heads h0+g, h0+g+8 (zero past nh)
  uint32_t qa[KS][4];
  {
    const T* q0 = static_cast<const T*>(a.q) + int64_t(t) * a.q_stride + int64_t(h0 + g) * HD;
    const T* q1 = q0 + 8 * HD;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int d = 32 * (ks / 2) + 8 * tq + 4 * (ks % 2);
      qa[ks][0] = g < nh ? ld_pair(q0 + d) : 0u;
      qa[ks][2] = g < nh ? ld_pair(q0 + d + 2) : 0u;
      qa[ks][1] = (R2 && g + 8 < nh) ? ld_pair(q1 + d) : 0u;
      qa[ks][3] = (R2 && g + 8 < nh) ? ld_pair(q1 + d + 2) : 0u;
    }
  }
  const T* kb = static_cast<const T*>(a.k_cache) + int64_t(kvh) * a.capacity * HD;
  const T* vb = static_cast<const T*>(a.v_cache) + int64_t(kvh) * a.capacity * HD;
  // block step i (NW tiles of 16 positions): warp w's tile starts at base + i * stride + 16 w
  // (decode_span: stride 16 NW in a contiguous slice)
  const DecodeSpan sp = decode_span(a, db, 16 * NW);
  const int pend = sp.end;
  const int niter = sp.steps(16 * warp);
  auto tile_pos = [&](int i) { return sp.base + i * sp.stride + 16 * warp; };
  auto slot = [&](int i, int c) { return &dsm[((i % RS) * NC + c) * 128 + tid]; };
  auto issue = [&](int i) {  // tile i's copies (positions past the span load base, masked later)
    if (i < niter) {
      const int pb = tile_pos(i);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int p = pb + 8 * nt + g, pc = p < pend ? p : sp.base;
#pragma unroll
        for (int m = 0; m < KM; ++m) cp_async16(slot(i, nt * KM + m), kb + int64_t(pc) * HD + 32 * m + 8 * tq, true);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int p = pb + 2 * tq + (j & 1) + 8 * (j >> 1), pc = p < pend ? p : sp.base;
#pragma unroll
        for (int c = 0; c < VM; ++c) cp_async16(slot(i, 2 * KM + j * VM + c), vb + int64_t(pc) * HD + DPL * g + 8 * c, true);
      }
    }
    cp_async_commit();
  };

  float o[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  issue(0);
  for (int i = 0; i < niter; ++i) {
    issue(i + 1);  // into the slot tile i-1 used
    cp_async_wait<1>();  // this thread's copies of tile i have landed
    const int pb = tile_pos(i);
    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int m = 0; m < KM; ++m) {
        const uint4 kv = *slot(i, nt * KM + m);
        mma_16816<T>(s[nt], qa[2 * m], kv.x, kv.y);
        mma_16816<T>(s[nt], qa[2 * m + 1], kv.z, kv.w);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = pb + 8 * nt + 2 * tq + e < pend;
        s[nt][e] = ok ? s[nt][e] * qs : -INFINITY;
        s[nt][2 + e] = ok ? s[nt][2 + e] * qs : -INFINITY;
      }
    }
    // online softmax per row; position pb is in the span, so each row max is finite
    float mx0 = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    const float mn0 = fmaxf(m0, mx0), c0 = exp2f(m0 - mn0);
    float p[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) p[nt][0] = exp2f(s[nt][0] - mn0), p[nt][1] = exp2f(s[nt][1] - mn0);
    l0 = l0 * c0 + ((p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
    m0 = mn0;
    float c1 = 1.f;
    if constexpr (R2) {
      float mx1 = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float mn1 = fmaxf(m1, mx1);
      c1 = exp2f(m1 - mn1);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) p[nt][2] = exp2f(s[nt][2] - mn1), p[nt][3] = exp2f(s[nt][3] - mn1);
      l1 = l1 * c1 + ((p[0][2] + p[0][3]) + (p[1][2] + p[1][3]));
      m1 = mn1;
    }
    uint32_t pa[4];
    pa[0] = pack2<T>(p[0][0], p[0][1]);
    pa[2] = pack2<T>(p[1][0], p[1][1]);
    pa[1] = R2 ? pack2<T>(p[0][2], p[0][3]) : 0u;
    pa[3] = R2 ? pack2<T>(p[1][2], p[1][3]) : 0u;
    // V of positions 2tq, 2tq+1, 2tq+8, 2tq+9: dims DPL g .. +DPL-1 as 32-bit words (2 dims each)
    uint32_t vw[4][DPL / 2];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < VM; ++c) {
        const uint4 v = *slot(i, 2 * KM + j * VM + c);
        vw[j][4 * c] = v.x, vw[j][4 * c + 1] = v.y, vw[j][4 * c + 2] = v.z, vw[j][4 * c + 3] = v.w;
      }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      o[j][0] *= c0, o[j][1] *= c0;
      if constexpr (R2) o[j][2] *= c1, o[j][3] *= c1;
      const uint32_t sel = (j & 1) ? 0x7632u : 0x5410u;  // the high or low dim of each word
      const uint32_t b0 = __byte_perm(vw[0][j / 2], vw[1][j / 2], sel);
      const uint32_t b1 = __byte_perm(vw[2][j / 2], vw[3][j / 2], sel);
      mma_16816<T>(o[j], pa, b0, b1);
    }
  }
  cp_async_wait<0>();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  if constexpr (R2) {
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  }
  __syncthreads();  // the ring is free: the warps' partials go there
  float* s_acc = reinterpret_cast<float*>(dsm);  // [NW][16][HD]
  float* s_ml = s_acc + NW * 16 * HD;             // [NW][16][2]
#pragma unroll
  for (int r = 0; r < (R2 ? 2 : 1); ++r) {
    float* rowp = s_acc + (warp * 16 + g + 8 * r) * HD;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      rowp[DPL * (2 * tq) + j] = o[j][2 * r];
      rowp[DPL * (2 * tq + 1) + j] = o[j][2 * r + 1];
    }
    if (tq == 0) {
      s_ml[(warp * 16 + g + 8 * r) * 2] = r ? m1 : m0;
      s_ml[(warp * 16 + g + 8 * r) * 2 + 1] = r ? l1 : l0;
    }
  }
  __syncthreads();
  // merge the warps; write the split's partials (attn_decode_kernel's format)
  const int64_t n_heads = a.n_heads;
  float* ws_ml = a.workspace;
  float* ws_acc = a.workspace + int64_t(gridDim.z) * n_heads * nsplit * 2;
  for (int idx = tid; idx < nh * HD; idx += 128) {
    const int r = idx / HD, d = idx % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, s_ml[(w * 16 + r) * 2]);
    float lsum = 0.f, asum = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float mw = s_ml[(w * 16 + r) * 2];
      const float c = (mw == -INFINITY) ? 0.f : exp2f(mw - M);
      lsum += s_ml[(w * 16 + r) * 2 + 1] * c;
      asum += s_acc[(w * 16 + r) * HD + d] * c;
    }
    const int64_t pi = (int64_t(t) * n_heads + h0 + r) * nsplit + split;
    ws_acc[pi * HD + d] = asum;
    if (d == 0) ws_ml[pi * 2] = M, ws_ml[pi * 2 + 1] = lsum;
  }
}

}  // namespace nf4flash::cuda
