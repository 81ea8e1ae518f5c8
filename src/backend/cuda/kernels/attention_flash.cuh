// FlashAttention-2 forward on tensor cores (portable sm_80+: mma.sync m16n8k16, ldmatrix, cp.async).
//
// attn_flash_kernel<T, HD>: causal attention of q [T_rows, n_heads*HD] (row stride q_stride) over the
// KV cache of one layer, K and V each [n_kv][capacity][HD] of the same dtype T (bf16 or f16);
// out [T_rows, n_heads*HD] (row stride out_stride). Query row t has absolute position pos0+t
// (pos0 read from device memory) and sees cache positions [0, pos0+t]. GQA: q head h reads kv
// head h / (n_heads/n_kv) (K/V never repeated; heads of one group are adjacent in blockIdx.x so
// they share the tiles through L2).
//
//   HD: any multiple of 16 up to 256 (32, 64, 80, 96, 128, 256 instantiated). Shared-memory rows
//   are HDS = HD rounded up to 64 elements (whole 128-byte swizzle groups).
//   grid (n_heads, ceil(T_rows/128)), 256 threads (8 warps), dynamic smem (128 + 2*STAGES*64)*HDS*2 B
//   (hd128: 96 KiB with 2 stages, 128 KiB with 3; hd256: 192 KiB with 2). A block owns 128 query
//   rows of one head; warp w owns rows 16w..16w+15 (one m16 tile): 8 warps x 16 rows keeps Q
//   (HD/16 A-fragments), the O accumulator (HD/8 n-tiles) and one S tile (64/8 n-tiles) in
//   registers at ~150 regs for hd128 with no spills, where 4 warps x 32 rows would need ~250 (FA2
//   re-reads Q from smem for that). At hd256 the O accumulator alone takes 128 registers: Q's
//   fragments are re-read from shared memory (ldmatrix) at each k step instead.
//   Sliding window (AttnArgs::window): the block's tiles start at its first row's first visible
//   key; tiles crossing a row's window edge are masked. Soft-capping (AttnArgs::softcap): each
//   score becomes softcap * tanh(s * scale / softcap) before the softmax (base 2, scale 1).
//   blockIdx.y is reversed so the longest (last) query tiles of every head start first and the
//   short ones fill the tail.
//   K/V tiles of 64 positions in a ring of STAGES buffers filled by cp.async (tile j+1 loads while j
//   computes); STAGES = 3 needs one barrier per tile instead of two (see the loop's end).
//   Shared-memory rows are HD*2 bytes in 16-byte chunks stored at chunk ^ (row & 7): the 8 rows
//   an ldmatrix phase reads land in 8 different bank groups (conflict-free), and cp.async writes
//   whole chunks.
//   S = Q K^T: A = Q fragments (registers), B = K rows via ldmatrix (non-transposed: K row-major
//   is the "col" B operand). O += P V: A = P re-packed from the S accumulators (no smem round
//   trip), B = V via ldmatrix.trans.
//   Online softmax in registers, base 2: scores are scaled by scale*log2(e) inside one FFMA
//   before ex2.approx; row max/sum over the 4 lanes of a quad; the row sum stays per-lane until
//   the end. Causal mask only on tiles crossing the block's diagonal; tiles past a warp's last
//   row are skipped by that warp; tiles past the block's last row are never loaded.
//   Rows past T_rows and cache rows past the block's last position are zero-filled (cp.async
//   src-size 0) and never written.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"  // smem_u32
#include "backend/cuda/kernels/mma.cuh"
#include "backend/cuda/kernels/cp_async.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

constexpr int kFlashBQ = 128;     // query rows per block
constexpr int kFlashBK = 64;      // cache positions per tile
constexpr int kFlashWarps = 8;
constexpr int kFlashThreads = 32 * kFlashWarps;

// Shared-memory row of a head_dim: whole 64-element (128-byte) swizzle groups.
__host__ __device__ constexpr int flash_row(int hd) { return (hd + 63) / 64 * 64; }
// K/V ring depth: 3, or 2 at head_dim 256 (192 KiB of shared memory).
__host__ __device__ constexpr int flash_stages(int hd) { return hd > 128 ? 2 : 3; }
__host__ __device__ constexpr int flash_smem_bytes(int hd, int stages) { return (kFlashBQ + 2 * stages * kFlashBK) * flash_row(hd) * 2; }


__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of 16-byte chunk `c` of row `r` in a swizzled tile with flash_row(HD)-element rows.
template <int HD>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return uint32_t(r * flash_row(HD) * 2 + ((c ^ (r & 7)) << 4));
}

// One tile's online-softmax step for a lane's two rows (g and g + 8 of its warp's 16): at(n, e) =
// score e of n-tile n in the mma/wgmma accumulator layout (e 0, 1: row g; 2, 3: row g + 8). Scores
// become base-2 exponentials in place; m_* (row max, unscaled) and l_* (per-lane partial row sums)
// advance; corr_* = the factor the row's output accumulator must be scaled by. A row with nothing
// visible yet keeps 0 as its base (no inf - inf).
template <int NT, typename At>
__device__ __forceinline__ void flash_softmax_tile(At&& at, float sl2, float& m_lo, float& m_hi, float& l_lo,
                                                   float& l_hi, float& corr_lo, float& corr_hi) {
  float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    mx_lo = fmaxf(mx_lo, fmaxf(at(n, 0), at(n, 1)));
    mx_hi = fmaxf(mx_hi, fmaxf(at(n, 2), at(n, 3)));
  }
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o2));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o2));
  }
  const float ms_lo = mx_lo == -INFINITY ? 0.f : mx_lo * sl2;
  const float ms_hi = mx_hi == -INFINITY ? 0.f : mx_hi * sl2;
  corr_lo = fast_exp2(m_lo == -INFINITY ? -INFINITY : m_lo * sl2 - ms_lo);
  corr_hi = fast_exp2(m_hi == -INFINITY ? -INFINITY : m_hi * sl2 - ms_hi);
  m_lo = mx_lo;
  m_hi = mx_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    at(n, 0) = fast_exp2(fmaf(at(n, 0), sl2, -ms_lo));
    at(n, 1) = fast_exp2(fmaf(at(n, 1), sl2, -ms_lo));
    at(n, 2) = fast_exp2(fmaf(at(n, 2), sl2, -ms_hi));
    at(n, 3) = fast_exp2(fmaf(at(n, 3), sl2, -ms_hi));
    sum_lo += at(n, 0) + at(n, 1);
    sum_hi += at(n, 2) + at(n, 3);
  }
  l_lo = l_lo * corr_lo + sum_lo;
  l_hi = l_hi * corr_hi + sum_hi;
}

// Copy `rows` rows of HD elements (global row stride `stride` elements) into a swizzled tile;
// rows >= valid are zero-filled.
template <typename T, int HD, int ROWS>
__device__ __forceinline__ void load_tile(uint32_t s_base, const T* g, int64_t stride, int valid) {
  constexpr int CPR = HD / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < (ROWS * CPR + kFlashThreads - 1) / kFlashThreads; ++i) {
    const int idx = i * kFlashThreads + threadIdx.x;
    if ((ROWS * CPR) % kFlashThreads != 0 && idx >= ROWS * CPR) break;
    const int r = idx / CPR, c = idx % CPR;
    const bool ok = r < valid;
    const T* src = ok ? g + int64_t(r) * stride + c * 8 : g;
    cp_async16_sa(s_base + swz<HD>(r, c), src, ok);
  }
}

template <typename T, int HD, int STAGES>
__global__ void __launch_bounds__(kFlashThreads, 1) attn_flash_kernel(const AttnArgs a) {
  static_assert(STAGES == 2 || STAGES == 3, "2 or 3 K/V stages");
  static_assert(HD % 16 == 0 && HD <= 256, "head_dim a multiple of 16, at most 256");
  constexpr int BQ = kFlashBQ, BK = kFlashBK, KS = HD / 16, NT_S = BK / 8, NT_O = HD / 8;
  constexpr int TILE = BK * flash_row(HD) * 2;  // bytes of one K or V stage
  constexpr bool Q_REGS = HD <= 128;            // Q's fragments held in registers (else re-read)
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t s_q = smem_u32(smem);
  const uint32_t s_k0 = s_q + BQ * flash_row(HD) * 2;  // K stage s at s_k0 + s*TILE, V after the K stages
  const uint32_t s_v0 = s_k0 + STAGES * TILE;

  const int h = blockIdx.x, G = a.n_heads / a.n_kv, kvh = h / G;
  const int qt = gridDim.y - 1 - blockIdx.y;  // longest tiles first
  const int t0 = qt * BQ;
  const int pos0 = a.pos0[0];
  const int rows = min(BQ, a.T - t0);
  const int kv_end = pos0 + t0 + rows;  // exclusive: last visible position + 1
  const int n_tiles = (kv_end + BK - 1) / BK;
  const int W = a.window;
  // sliding window: tiles before the one holding the block's first row's first key are not read
  const int j0 = attn_first_key(pos0 + t0 + 1, W) / BK;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;

  const T* qg = static_cast<const T*>(a.q) + int64_t(t0) * a.q_stride + int64_t(h) * HD;
  const T* kg = static_cast<const T*>(a.k_cache) + int64_t(kvh) * a.capacity * HD;
  const T* vg = static_cast<const T*>(a.v_cache) + int64_t(kvh) * a.capacity * HD;

  load_tile<T, HD, BQ>(s_q, qg, a.q_stride, rows);
  load_tile<T, HD, BK>(s_k0, kg + int64_t(j0) * BK * HD, HD, kv_end - j0 * BK);
  load_tile<T, HD, BK>(s_v0, vg + int64_t(j0) * BK * HD, HD, kv_end - j0 * BK);
  cp_async_commit();

  // rows of this lane: r_lo = 16*warp + g and r_lo + 8; absolute positions:
  const int q_lo = pos0 + t0 + 16 * warp + g, q_hi = q_lo + 8;
  const int warp_qmax = pos0 + t0 + 16 * warp + 15;  // last position any row of the warp sees
  const int block_qmin = pos0 + t0;
  const bool capped = a.softcap > 0.f;
  const float sl2 = capped ? 1.4426950408889634f : a.scale * 1.4426950408889634f;
  const float cap_in = capped ? a.scale / a.softcap : 0.f;
  // window: first key of the lane's rows and of the warp's first row (keys before it: no row sees them)
  const int lo_lo = W > 0 ? q_lo - W + 1 : 0, lo_hi = W > 0 ? q_hi - W + 1 : 0;
  const int warp_kmin = W > 0 ? pos0 + t0 + 16 * warp - W + 1 : 0;

  uint32_t qf[Q_REGS ? KS : 1][4];
  float o[NT_O][4];
#pragma unroll
  for (int n = 0; n < NT_O; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

  for (int j = j0; j < n_tiles; ++j) {
    const int st = (j - j0) % STAGES, nx = (j - j0 + 1) % STAGES;
    if (j + 1 < n_tiles) {
      const int kb1 = (j + 1) * BK;
      load_tile<T, HD, BK>(s_k0 + nx * TILE, kg + int64_t(kb1) * HD, HD, kv_end - kb1);
      load_tile<T, HD, BK>(s_v0 + nx * TILE, vg + int64_t(kb1) * HD, HD, kv_end - kb1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int q_row = 16 * warp + (lane & 15);  // the row this lane addresses in Q's ldmatrix
    if constexpr (Q_REGS) {
      if (j == j0) {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks)
          ldsm_x4(s_q + swz<HD>(q_row, 2 * ks + (lane >> 4)), qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3]);
      }
    }
    const int kb = j * BK;
    if (kb <= warp_qmax && kb + BK - 1 >= warp_kmin) {
      const uint32_t sk = s_k0 + st * TILE, sv = s_v0 + st * TILE;
      // ---- S = Q K^T (16 x BK per warp)
      float s[NT_S][4];
#pragma unroll
      for (int n = 0; n < NT_S; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const int qk = Q_REGS ? ks : 0;
        if constexpr (!Q_REGS)
          ldsm_x4(s_q + swz<HD>(q_row, 2 * ks + (lane >> 4)), qf[0][0], qf[0][1], qf[0][2], qf[0][3]);
#pragma unroll
        for (int np = 0; np < NT_S / 2; ++np) {
          uint32_t b0, b1, b2, b3;
          const int r = np * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldsm_x4(sk + swz<HD>(r, 2 * ks + ((lane >> 3) & 1)), b0, b1, b2, b3);
          mma_16816<T>(s[2 * np], qf[qk], b0, b1);
          mma_16816<T>(s[2 * np + 1], qf[qk], b2, b3);
        }
      }
      // ---- soft-capping: s = softcap * tanh(s * scale / softcap) (the softmax then in base 2, scale 1)
      if (capped) {
#pragma unroll
        for (int n = 0; n < NT_S; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[n][e] = a.softcap * tanhf(s[n][e] * cap_in);
      }
      // ---- causal mask on tiles crossing the diagonal; the window's edge on tiles crossing it
      if (kb + BK - 1 > block_qmin) {
#pragma unroll
        for (int n = 0; n < NT_S; ++n) {
          const int p = kb + n * 8 + 2 * c;
          if (p > q_lo) s[n][0] = -INFINITY;
          if (p + 1 > q_lo) s[n][1] = -INFINITY;
          if (p > q_hi) s[n][2] = -INFINITY;
          if (p + 1 > q_hi) s[n][3] = -INFINITY;
        }
      }
      if (W > 0 && kb < lo_hi) {
#pragma unroll
        for (int n = 0; n < NT_S; ++n) {
          const int p = kb + n * 8 + 2 * c;
          if (p < lo_lo) s[n][0] = -INFINITY;
          if (p + 1 < lo_lo) s[n][1] = -INFINITY;
          if (p < lo_hi) s[n][2] = -INFINITY;
          if (p + 1 < lo_hi) s[n][3] = -INFINITY;
        }
      }
      // ---- online softmax (rows g and g+8 of the warp's tile)
      float corr_lo, corr_hi;
      flash_softmax_tile<NT_S>([&](int n, int e) -> float& { return s[n][e]; }, sl2, m_lo, m_hi, l_lo, l_hi, corr_lo,
                               corr_hi);
#pragma unroll
      for (int n = 0; n < NT_O; ++n) {
        o[n][0] *= corr_lo;
        o[n][1] *= corr_lo;
        o[n][2] *= corr_hi;
        o[n][3] *= corr_hi;
      }
      // ---- O += P V
#pragma unroll
      for (int kp = 0; kp < BK / 16; ++kp) {
        uint32_t pa[4];
        pa[0] = pack2<T>(s[2 * kp][0], s[2 * kp][1]);
        pa[1] = pack2<T>(s[2 * kp][2], s[2 * kp][3]);
        pa[2] = pack2<T>(s[2 * kp + 1][0], s[2 * kp + 1][1]);
        pa[3] = pack2<T>(s[2 * kp + 1][2], s[2 * kp + 1][3]);
#pragma unroll
        for (int nd = 0; nd < HD / 16; ++nd) {
          uint32_t b0, b1, b2, b3;
          const int r = kp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
          ldsm_x4_t(sv + swz<HD>(r, 2 * nd + (lane >> 4)), b0, b1, b2, b3);
          mma_16816<T>(o[2 * nd], pa, b0, b1);
          mma_16816<T>(o[2 * nd + 1], pa, b2, b3);
        }
      }
    }
    // 2 stages: the next iteration refills this stage, so wait for every warp. 3 stages: the
    // stage refilled next was last read two tiles ago, before this iteration's barrier, so warps
    // may drift by a tile (one warp's softmax overlaps another's MMAs).
    if constexpr (STAGES == 2) __syncthreads();
  }

  // ---- normalize and store
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
  }
  const float inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f, inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
  const int r_lo = t0 + 16 * warp + g, r_hi = r_lo + 8;
  T* og = static_cast<T*>(a.out) + int64_t(h) * HD + 2 * c;
#pragma unroll
  for (int n = 0; n < NT_O; ++n) {
    if (r_lo < a.T)
      *reinterpret_cast<uint32_t*>(og + int64_t(r_lo) * a.out_stride + n * 8) = pack2<T>(o[n][0] * inv_lo, o[n][1] * inv_lo);
    if (r_hi < a.T)
      *reinterpret_cast<uint32_t*>(og + int64_t(r_hi) * a.out_stride + n * 8) = pack2<T>(o[n][2] * inv_hi, o[n][3] * inv_hi);
  }
}

}  // namespace nf4flash::cuda
