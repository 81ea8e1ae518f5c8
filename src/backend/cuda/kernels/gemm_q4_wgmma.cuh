// Fused 4-bit x bf16/f16 GEMM on Hopper tensor cores (wgmma, sm_90a): the prefill linears.
//   out[n, r] = sum_k x[n, k] * w(r, k)  (+ bias[r]),  w(r, k) = round16(code[q(r, k)] * absmax(r, k))
//   with the product in f32 -- what bitsandbytes' dequantize_4bit feeds its prefill matmul (its
//   one-token inference kernel rounds code and absmax to 16 bits first; that arithmetic put the GPU
//   prefill of the qwen2-bias NF4 golden 5% past its tolerance); products accumulate in f32.
// x: [T, cols] compute dtype (bf16 or f16), row-major; out: [T, rows], compute dtype or f32;
// weights: Q4Device's tile16x64 layout (kernels/gemv_q4.cuh), absmax plain f32 or double-quant u8
// codes decoded here.
//
// This file holds the pieces the warp-specialized kernel (gemm_q4_wgmma_ws.cuh) computes with:
//   - the decode of a row tile straight into wgmma A fragments (registers, "RS" wgmma): lane
//     (g, t) loads its 16 code bytes (rows g, g + 8 x columns 16t .. 16t + 15), a 4 x 4 exchange
//     of 4-byte packets inside the quad (4 shuffles) gives it the bytes of its fragment slots
//     (columns 16s + 2t, +1, +8, +9 of K step s), each byte becomes two f32 codes through a
//     per-lane copy of a byte -> code-pair table in shared memory (one 8-byte LDS), times the f32
//     absmax (two FMUL), rounded into one 16-bit pair (one cvt);
//   - the 4 wgmma m64nBNk16 of each column tile of a step (1 or 2 tiles) against its x tile
//     [BN x 64] in the 128-byte swizzled K-major layout (wgmma's B operand, kernels/wgmma.cuh);
//   - the store of the accumulators (+ bias). Rows beyond `rows` (the layout pads to 16) and tokens
//     beyond T are never stored.
#pragma once
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/kernels/mma.cuh"
#include "backend/cuda/kernels/wgmma.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

// The code-pair table in shared memory: [256][32][2] f32, lane L's copy of entry b at byte
// 256b + 8L: code[b >> 4], code[b & 15].
constexpr int kQ4gLutBytes = 256 * 32 * 8;

// {lo, hi} rounded to a 16-bit pair (lo in the low half)
template <typename TA>
__device__ __forceinline__ uint32_t cvt2_16(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<TA, __nv_bfloat16>) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  else asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The f32 code-pair table (kQ4gLutBytes) from the 16 codes; the caller syncs after.
__device__ __forceinline__ void q4g_fill_lut(uint32_t lut_s, const float* code) {
  for (int i = threadIdx.x; i < 256 * 16; i += blockDim.x) {  // 16 x 16 bytes (two lanes each) per entry
    const int byte = i >> 4;
    const float lo = code[byte >> 4], hi = code[byte & 15];
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(lut_s + uint32_t(i) * 16u), "f"(lo), "f"(hi), "f"(lo),
                 "f"(hi)
                 : "memory");
  }
}

// Double quant: the nested absmax of rows 16 rt + g and + 8 (clamped into range) for column tile
// kt. Everything the K loop needs is copied into registers here (the weight descriptor may live in
// parameter space behind a generic pointer, which the loop's asm memory clobbers would re-read).
template <bool DQ>
struct Q4gNested {
  int64_t r0c = 0, r1c = 0;
  const float* nab = nullptr;
  int lb = 0, ln = 0;
  __device__ __forceinline__ Q4gNested(const Q4Device& w, int64_t rt, int g) {
    if constexpr (DQ) {
      r0c = min(rt * 16 + g, w.rows - 1) * w.cols;
      r1c = min(rt * 16 + g + 8, w.rows - 1) * w.cols;
      nab = w.nested_absmax;
      lb = w.log2_blocksize;
      ln = w.log2_nested;
    }
  }
  __device__ __forceinline__ void load(int kt, float& n0, float& n1) const {
    if constexpr (DQ) {
      const int64_t c = int64_t(kt) * 64;
      n0 = __ldg(nab + (((r0c + c) >> lb) >> ln));
      n1 = __ldg(nab + (((r1c + c) >> lb) >> ln));
    }
  }
};

// Issue the wgmma m64nBNk16 of a step's KS column tiles as one committed group: tile j's 4 K steps
// with A = A[16j ..] (the decoded fragments) and B = the x tile at shared address xs[j].
template <typename TA, int BN, int KS>
__device__ __forceinline__ void q4g_mma_tiles(float (&acc)[BN / 2], const uint32_t (&A)[16 * KS],
                                              const uint32_t (&xs)[KS]) {
  wgmma_fence_regs(acc);
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < KS; ++j) {
    const uint64_t db = wgmma_desc_sw128(xs[j]);
#pragma unroll
    for (int s = 0; s < 4; ++s) wgmma_rs<BN, std::is_same_v<TA, __nv_bfloat16>>(acc, &A[16 * j + 4 * s], db + 2 * s, 1);
  }
  wgmma_commit();
  wgmma_fence_regs(acc);
}

// Decode one row tile's column tile into the A fragments of its 4 K steps (A[0..15], see
// wgmma_rs): wq = shared address of the tile's 512 code bytes, sca = of its absmax (16 f32, or 16
// u8 codes: then s_nested / nab0, nab1 / offset give the double-quant value), lut_s = the
// code-pair table, lane8 = 8 * lane.
template <typename TA, bool DQ>
__device__ __forceinline__ void q4g_decode_a(uint32_t wq, uint32_t sca, uint32_t lut_s, uint32_t lane8, int g, int t,
                                             const float* s_nested, float nab0, float nab1, float offset,
                                             uint32_t* A) {
  uint4 q;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "r"(wq));
  float s0, s1;
  if constexpr (!DQ) {
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(s0) : "r"(sca + g * 4));
    asm volatile("ld.shared.f32 %0, [%1];" : "=f"(s1) : "r"(sca + g * 4 + 32));
  } else {
    uint32_t c0, c1;
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(c0) : "r"(sca + g));
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(c1) : "r"(sca + g + 8));
    // bitsandbytes: product rounded to f32, then the offset added (never fused)
    s0 = __fadd_rn(__fmul_rn(s_nested[c0], nab0), offset);
    s1 = __fadd_rn(__fmul_rn(s_nested[c1], nab1), offset);
  }
  // Packets for quad lane t' (halfword t' & 1 of words t' >> 1 and (t' >> 1) + 2): bytes
  // [row g, row g + 8] x columns 2t', 2t' + 1 of this lane's 16, then the same at 2t' + 8.
  const uint32_t P0 = __byte_perm(q.x, q.z, 0x5410), P1 = __byte_perm(q.x, q.z, 0x7632);
  const uint32_t P2 = __byte_perm(q.y, q.w, 0x5410), P3 = __byte_perm(q.y, q.w, 0x7632);
  // 4 x 4 transpose in the quad: R[s] = lane s's packet for this lane = K step s's bytes.
  const bool hi = t & 2, lo = t & 1;
  const uint32_t e0 = __shfl_xor_sync(0xffffffffu, hi ? P0 : P2, 2);
  const uint32_t e1 = __shfl_xor_sync(0xffffffffu, hi ? P1 : P3, 2);
  const uint32_t Q0 = hi ? e0 : P0, Q1 = hi ? e1 : P1, Q2 = hi ? P2 : e0, Q3 = hi ? P3 : e1;
  const uint32_t f0 = __shfl_xor_sync(0xffffffffu, lo ? Q0 : Q1, 1);
  const uint32_t f1 = __shfl_xor_sync(0xffffffffu, lo ? Q2 : Q3, 1);
  const uint32_t R[4] = {lo ? f0 : Q0, lo ? Q1 : f0, lo ? f1 : Q2, lo ? Q3 : f1};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // [lane8, code byte k, 0, 0] = byte * 256 + 8 * lane: lane's copy of the byte's code pair
      const uint32_t off = __byte_perm(R[s], lane8, 0x5504u | (uint32_t(k) << 4));
      float c0, c1;
      asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(c0), "=f"(c1) : "r"(lut_s + off));
      const float sc = (k & 1) ? s1 : s0;
      A[4 * s + k] = cvt2_16<TA>(__fmul_rn(c0, sc), __fmul_rn(c1, sc));
    }
  }
}

// The accumulator tile of warp `warp` (rows 16 * warp + g, + 8 of the block x BN tokens from n0)
// to out [T, rows] (+ bias).
template <typename TO, int BN>
__device__ __forceinline__ void q4g_store(TO* out, int64_t rows, const float* bias, int T, const float* acc,
                                          int64_t row_g, int n0, int t) {
  const int64_t f0 = row_g, f1 = row_g + 8;
  const float b0 = (bias && f0 < rows) ? bias[f0] : 0.f, b1 = (bias && f1 < rows) ? bias[f1] : 0.f;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int n = n0 + 8 * j + 2 * t + (e & 1);
      const int64_t f = (e & 2) ? f1 : f0;
      if (n < T && f < rows) out[int64_t(n) * rows + f] = from_f32<TO>(acc[4 * j + e] + ((e & 2) ? b1 : b0));
    }
  }
}

}  // namespace nf4flash::cuda
