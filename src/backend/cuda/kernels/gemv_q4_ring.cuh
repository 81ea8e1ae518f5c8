// 4-bit GEMV, "ring" variant: the math and layout of gemv_q4_kernel (kernels/gemv_q4.cuh: tiles of
// 16 rows x 64 columns, 512 bytes, mma.sync with the tokens as columns, f32 accumulation), but the
// weight tiles AND their absmax bytes stream through a per-warp shared-memory ring with cp.async,
// S - 1 batches of U tiles ahead of the math, so the bytes in flight cost no registers and the
// absmax loads are as far ahead as the weights (the register kernel fetches both one batch ahead:
// with a batch's math much shorter than a DRAM round trip, every batch waited).
//   out[n, r] = sum_k x[n, k] * code[q(r, k)] * absmax(r, k) (+ bias[r]),  n < T <= 8
// Shapes: x [T, cols] TA (bf16/f16), out [T, rows] TA or f32; W warps per block; block b owns row
// tiles b, b + grid, ...; within a row tile, batch i of warp w covers column tiles
// i*W*U + u*W + w (u < U), so every warp has the same number of batches per row tile and the
// row-tile reduction (q4_finish_row_tile, a block barrier) lines up.
// Shared memory (dynamic): the byte -> two codes table ([256][32] words, ADDR 1, or [256][64],
// ADDR 2: q4_tile_mma_prmt), then the ring [W][S][U] x (512 weight bytes + AB absmax bytes), AB =
// 16 (double quant: u8 codes) or 64 (plain: f32). Lane L copies and reads its own 16 weight bytes;
// the absmax bytes are copied by lanes 0..AB/16-1 and read by lanes 0..15 (hence __syncwarp).
// Index math is incremental (no 64-bit division per batch: that cost the old cp.async variant
// a 1.5x slowdown).
#pragma once
#include "backend/cuda/kernels/gemv_q4.cuh"

namespace nf4flash::cuda {

template <bool DQ> __host__ __device__ constexpr int q4_ring_ab() { return DQ ? 16 : 64; }
__host__ __device__ constexpr int q4_ring_bytes(int W, int S, int U, bool dq) {
  return W * S * U * (512 + (dq ? 16 : 64));
}

template <typename TA, bool DQ, int W, int U, int S, int ADDR, int MINB>
__global__ void __launch_bounds__(W * 32, MINB) gemv_q4_ring_kernel(const Q4KernelArgs a) {
  static_assert(S >= 2 && (ADDR == 1 || ADDR == 2), "ring: S >= 2, byte_perm addressing");
  constexpr int AB = q4_ring_ab<DQ>(), LS = ADDR == 2 ? 64 : 32;
  extern __shared__ __align__(16) uint32_t lut[];  // table, then the ring
  uint4* ring_w = reinterpret_cast<uint4*>(lut + 256 * LS);                  // [W][S][U][32]
  uint8_t* ring_a = reinterpret_cast<uint8_t*>(ring_w + W * S * U * 32);     // [W][S][U][AB]
  __shared__ float red[W][16][8];
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t KT = a.w.KT, cols = a.w.cols, rows = a.w.rows, RT = a.w.RT;
  const int NB = int((KT + W * U - 1) / (W * U));  // batches per row tile
  const uint4* tiles = reinterpret_cast<const uint4*>(a.w.tiles);
  const uint8_t* absb = DQ ? a.w.absq_tiled : reinterpret_cast<const uint8_t*>(a.w.absmax_tiled);
  uint4* my_w = ring_w + warp * S * U * 32;
  uint8_t* my_a = ring_a + warp * S * U * AB;
  if (int64_t(blockIdx.x) >= RT) return;

  // issue pointer: the (row tile, batch) of the next batch to copy, and its ring slot
  int64_t irt = blockIdx.x;
  int ib = 0, islot = 0;
  auto issue = [&]() {
    if (irt < RT) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kt = int64_t(ib) * W * U + u * W + warp;
        const bool ok = kt < KT;
        const int64_t tile = irt * KT + (ok ? kt : 0);
        cp_async16(my_w + (islot * U + u) * 32 + lane, tiles + tile * 32 + lane, ok);
        if (lane < AB / 16) cp_async16(my_a + (islot * U + u) * AB + lane * 16, absb + tile * AB + lane * 16, ok);
      }
      if (++ib == NB) { ib = 0; irt += gridDim.x; }
      if (++islot == S) islot = 0;
    }
    cp_async_commit();
  };
  // the first S - 1 batches read weights only: before the table is built and before pdl_wait
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue();

  pdl_trigger();
  q4_block_setup<TA, DQ, LS>(a.w, lut, s_bits, s_nested_code);
  pdl_wait();

  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut));
  const uint32_t lane_b = ADDR == 1 ? 8u * lane : 4u * lane;
  const TA* xrow = static_cast<const TA*>(a.x) + int64_t(min(g, a.T - 1)) * cols + 16 * t;
  const int r16 = lane & 15;
  const bool idx32 = rows * cols < (int64_t(1) << 31);

  int slot = 0;
  for (int64_t rt = blockIdx.x; rt < RT; rt += gridDim.x) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    int64_t my_row = rt * 16 + r16;
    my_row = my_row < rows ? my_row : rows - 1;
    for (int b = 0; b < NB; ++b) {
      __syncwarp();  // every lane is done with the slot the next issue overwrites
      issue();
      cp_async_wait<S - 1>();
      __syncwarp();  // the absmax bytes other lanes copied are visible
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kt = int64_t(b) * W * U + u * W + warp;
        if (kt < KT) {  // warp-uniform
          const uint4* xp = reinterpret_cast<const uint4*>(xrow + kt * 64);
          const uint4 xa = __ldg(xp), xb = __ldg(xp + 1);
          const uint4 wq = my_w[(slot * U + u) * 32 + lane];
          float sv;
          if constexpr (DQ) {
            const int q = my_a[(slot * U + u) * AB + r16];
            const int64_t blk = idx32 ? int64_t((uint32_t(my_row) * uint32_t(cols) + uint32_t(kt) * 64u) >> a.w.log2_blocksize)
                                      : (my_row * cols + kt * 64) >> a.w.log2_blocksize;
            sv = __fadd_rn(__fmul_rn(s_nested_code[q], __ldg(a.w.nested_absmax + (blk >> a.w.log2_nested))), a.w.offset);
          } else {
            sv = reinterpret_cast<const float*>(my_a + (slot * U + u) * AB)[r16];
          }
          const float sg = __shfl_sync(0xffffffffu, sv, g);
          const float sg8 = __shfl_sync(0xffffffffu, sv, g + 8);
          float d[4] = {0.f, 0.f, 0.f, 0.f};
          q4_tile_mma_prmt<TA, ADDR>(lut_s, lane_b, wq, xa, xb, d);
          acc[0] = fmaf(d[0], sg, acc[0]);
          acc[1] = fmaf(d[1], sg, acc[1]);
          acc[2] = fmaf(d[2], sg8, acc[2]);
          acc[3] = fmaf(d[3], sg8, acc[3]);
        }
      }
      if (++slot == S) slot = 0;
    }
    q4_finish_row_tile<TA, W>(red, acc, rt, rows, a.T, a.bias, a.out, a.out_f32);
  }
  cp_async_wait<0>();
}

}  // namespace nf4flash::cuda
