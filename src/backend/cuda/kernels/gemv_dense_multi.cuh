// Dense decode GEMV over up to three weights sharing x, in one launch (q/k/v), or gate and up with
// the SwiGLU epilogue (gate+up+silu):
//
//   Store  : out_s[n, r] = sum_k x[n, k] * W_s[r, k] + b_s[r]              (s < nseg, n < T <= 8)
//   SwiGLU : out[n, r]   = silu(round(x G[r]^T + bg[r])) * round(x U[r]^T + bu[r]), rounded
//
// W_s: [N_s, K] row-major, 16-bit (bf16/f16), 16-byte aligned, K % 8 == 0; x: [T, K] compute
// dtype; out: compute dtype (or f32 for Store). f32 accumulation.
// Work: a unit is one row of the concatenated segments (Store) or one row of gate with the same
// row of up (SwiGLU); one warp per unit, 8 units per 256-thread block, grid-stride. Lane l takes
// the 16-byte chunks l, l + 32, ... of each row in that order, U chunks per row in flight
// (streaming loads, L1 no-allocate), x through L1 — gemv_dense_vec_kernel's per-chunk step
// (dense_x8, dense_dot8) and warp sum, so each output is bit for bit what separate launches (plus
// silu_mul) give.
// Why: the decode step of a bf16-weight model spent ~10 us per launch on k and v (8 MB each) and a
// launch on silu_mul (ncu, H200): fixed costs, not bytes.
#pragma once
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels/gemv_dense.cuh"
#include "backend/cuda/kernels/gemv_q4.cuh"

namespace nf4flash::cuda {

struct DenseMultiArgs {
  const void* w[3];
  const float* bias[3];  // null: none
  void* out[3];          // SwiGLU: out[0] only
  int64_t unit_end[3];   // Store: cumulative rows of segments 0..s; SwiGLU: unit_end[0] = rows
  int64_t K, units;
  const void* x;
  int nseg, T, out_f32;
};

// x through L1 (dense_x8). A warp's first batch of weights is loaded before the PDL wait (the
// weights depend on no earlier kernel). Grid: ceil(units / 8) blocks; 256 threads.
template <typename TW, typename TA, int TN, bool SW, int U>
__global__ void __launch_bounds__(256) gemv_dense_multi_kernel(const __grid_constant__ DenseMultiArgs a) {
  pdl_trigger();
  constexpr int NR = SW ? 2 : 1;  // rows per unit
  const int lane = threadIdx.x & 31;
  const int64_t K8 = a.K / 8;
  int64_t u = int64_t(blockIdx.x) * 8 + (threadIdx.x >> 5);
  int seg[NR];
  int64_t row = 0;
  const uint4* wr[NR];
  auto unit_rows = [&]() {  // segment(s), row and row pointers of unit u
    row = u;
    if constexpr (SW) {
      seg[0] = 0;
      seg[1] = 1;
    } else {
      int s = 0;
      while (s + 1 < a.nseg && u >= a.unit_end[s]) ++s;
      seg[0] = s;
      if (s) row = u - a.unit_end[s - 1];
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) wr[r] = static_cast<const uint4*>(a.w[seg[r]]) + row * K8;
  };
  uint4 wv[NR][U];
  auto load_batch = [&](int64_t c0) {
#pragma unroll
    for (int uu = 0; uu < U; ++uu)
#pragma unroll
      for (int r = 0; r < NR; ++r)
        if (c0 + 32 * uu < K8) wv[r][uu] = ld_stream_u4(wr[r] + c0 + 32 * uu);
  };
  bool have = u < a.units;  // wv holds the first batch of unit u
  if (have) {
    unit_rows();
    load_batch(lane);
  }
  pdl_wait();
  for (; u < a.units; u += int64_t(gridDim.x) * 8) {
    if (!have) unit_rows();
    float acc[NR][TN];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int n = 0; n < TN; ++n) acc[r][n] = 0.f;
    for (int64_t c0 = lane; c0 < K8; c0 += 32 * U) {
      if (!have) load_batch(c0);
      have = false;
#pragma unroll
      for (int uu = 0; uu < U; ++uu) {
        const int64_t c = c0 + 32 * uu;
        if (c < K8) {
#pragma unroll
          for (int n = 0; n < TN; ++n) {
            if (n < a.T) {
              float xf[8];  // once for both rows of a SwiGLU unit
              dense_x8<TA>(a.x, a.K, n, c, xf);
#pragma unroll
              for (int r = 0; r < NR; ++r) {
                float wf[8];
                unpack8<TW>(wv[r][uu], wf);
                acc[r][n] = dense_dot8(wf, xf, acc[r][n]);
              }
            }
          }
        }
      }
    }
#pragma unroll
    for (int n = 0; n < TN; ++n) {
      if (n < a.T) {
        float v[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) v[r] = warp_sum(acc[r][n]);
        if (lane == 0) {
          const int64_t N = SW ? a.units : (seg[0] ? a.unit_end[seg[0]] - a.unit_end[seg[0] - 1] : a.unit_end[0]);
#pragma unroll
          for (int r = 0; r < NR; ++r)
            if (a.bias[seg[r]]) v[r] += a.bias[seg[r]][row];
          if constexpr (SW) {
            q4_store_swiglu<TA>(a.out[0], n * N + row, to_f32<TA>(from_f32<TA>(v[0])), to_f32<TA>(from_f32<TA>(v[1])));
          } else {
            q4_store_y<TA>(a.out[seg[0]], n * N + row, v[0], a.out_f32, false);
          }
        }
      }
    }
  }
}

}  // namespace nf4flash::cuda
