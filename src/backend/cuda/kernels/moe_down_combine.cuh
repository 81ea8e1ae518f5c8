// A decode step's (one row, T = 1) expert down products and their weighted sum in one launch:
// moe_gemv_kernel's down products (Store, one row) and moe_combine_kernel in a single kernel.
//
//   y_k[r]  = round(h[k] . down_{e_k}[r])                  k < K: the k-th chosen expert e_k (ascending),
//                                                           h [K, I] its SwiGLU row (position k)
//   out[r]  = round(sum_k wts[k] * y_k[r] (+ sigmoid(shared_logit) * shared[r]))     r < H, k ascending
//             (residual: out[r] = round(out[r] + that), add()'s arithmetic)
//
// f32 accumulation, y_k rounded to the compute dtype before the sum (the two kernels' arithmetic;
// the down products' summation order over 64-column tiles differs from moe_gemv_kernel's). Block b
// takes the 16-row tiles rt = b, b + G, ... of the down matrices ([H, I], tile16x64 4-bit, NF4/FP4,
// plain or double-quant absmax, I % 64 == 0); per tile, warp w < K * NW (NW = W / K warps an
// expert) takes expert k = w % K and its 64-column tiles kt = w / K, + NW, ...: up to B of them in
// flight, each through the per-lane byte table into mma.m16n8k16 (moe_tile_mma1). Each expert's
// warp sums go to shared memory, then 16 threads sum them per row and expert and the experts per
// row. No routing arrays beyond ids and wts: position k holds expert ids[k]'s one pair.
#pragma once
#include "backend/cuda/kernels/moe.cuh"

namespace nf4flash::cuda {

template <typename TA, MoeKind WK>
__global__ void __launch_bounds__(kMoeDcWarps * 32, 1) moe_down_combine_kernel(const __grid_constant__ MoeDownCombineArgs a) {
  static_assert(WK != MoeKind::Dense && sizeof(TA) == 2, "moe_down_combine_kernel: 4-bit experts at bf16/f16");
  constexpr int W = kMoeDcWarps, B = 8;
  extern __shared__ __align__(16) uint32_t lut[];  // [256][64] byte -> two codes (q4_fill_lut)
  __shared__ float red[W][16];
  __shared__ uint32_t s_bits[16];
  __shared__ float s_nested[256];
  __shared__ int32_t s_e[kMoeMaxTopK];
  __shared__ float s_w[kMoeMaxTopK];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut)), lane_b = 4u * lane;
  const MoeMatArgs& m = a.m;
  const int K = a.sum.K, NW = W / K;
  const int k = warp % K, j = warp / K;  // this warp's expert and its rank among the expert's NW warps
  const bool active = warp < K * NW;
  const int64_t RT = m.RT, KT = m.KT, rows = m.rows, cols = m.cols;
  pdl_trigger();
  if (tid < 16) s_bits[tid] = bits16<TA>(m.code[tid]);
  if constexpr (WK == MoeKind::Q4DoubleQuant)
    for (int i = tid; i < 256; i += blockDim.x) s_nested[i] = m.nested_code[i];
  __syncthreads();
  q4_fill_lut<64, W * 32>(lut, s_bits);
  pdl_wait();  // the routing (ids, wts) and h
  if (tid < K) {
    s_e[tid] = a.ids[tid];
    s_w[tid] = a.sum.wts[tid];
  }
  __syncthreads();  // the table and the routing
  const MoeExpertW x = active ? m.experts[s_e[k]] : MoeExpertW{};
  for (int64_t rt = blockIdx.x; rt < RT; rt += gridDim.x) {
    float acc[1][2] = {{0.f, 0.f}};
    if (active) {
      for (int64_t kt0 = j; kt0 < KT; kt0 += int64_t(NW) * B) {
        MoeRaw raw[B];  // every load of the batch out before the first mma
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const int64_t kt = kt0 + int64_t(NW) * b;
          if (kt < KT) raw[b] = moe_tile_load<WK>(m, x, rt, kt);
        }
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const int64_t kt = kt0 + int64_t(NW) * b;
          if (kt >= KT) break;
          uint4 xa, xb;
          moe_x16<TA>(static_cast<const TA*>(a.x), k, cols, kt, xa, xb);
          moe_tile_mma1<TA, WK>(raw[b], x.offset, lut_s, lane_b, s_nested, xa, xb, acc);
        }
      }
    }
    if (t == 0) {  // every lane holds its rows' sums over the tiles (moe_tile_mma1)
      red[warp][g] = acc[0][0];
      red[warp][g + 8] = acc[0][1];
    }
    __syncthreads();
    if (tid < 16) {
      const int64_t row = rt * 16 + tid;
      if (row < rows) {
        float s = 0.f;
        for (int kk = 0; kk < K; ++kk) {
          float y = 0.f;
          for (int jj = 0; jj < NW; ++jj) y += red[jj * K + kk][tid];
          s = fmaf(s_w[kk], to_f32<TA>(from_f32<TA>(y)), s);
        }
        if (a.sum.shared) s = moe_add_shared(s, a.sum.shared_logit[0], static_cast<const TA*>(a.sum.shared)[row]);
        q4_store_y<TA>(a.sum.out, row, s, 0, a.sum.residual);
      }
    }
    __syncthreads();  // red read before the next row tile's writes
  }
}

}  // namespace nf4flash::cuda
