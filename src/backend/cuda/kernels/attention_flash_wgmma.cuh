// FlashAttention forward on Hopper tensor cores (wgmma + TMA, sm_90a only): the same product as
// attn_flash_kernel (kernels/attention_flash.cuh) -- causal attention of q [T_rows, n_heads*HD]
// over one layer's KV cache (K, V each [n_kv][capacity][HD], dtype T = bf16 or f16), query row t
// at absolute position pos0 + t (pos0 in device memory) seeing cache positions [0, pos0 + t],
// GQA without repeating K/V -- with the FA3 structure:
//
//   grid (n_heads, ceil(T_rows / 128)), 384 threads, blockIdx.y reversed (longest tiles first).
//   warps 0-3  producer warpgroup (setmaxnreg 40): lane 0 of warp 0 walks the block's KV tiles
//              (BK = 128 positions) S stages ahead; per tile it issues HD/64 TMA copies of K and
//              as many of V (tensor maps over the layer's cache viewed as [n_kv * capacity, HD],
//              boxes of 64 columns x BK rows, 128-byte swizzle) completing on the stage's `full`
//              mbarrier. Rows past the block's last visible position arrive as whatever the cache
//              holds there (kv_allocate zeroes it; written rows are finite) and are masked.
//   warps 4-11 two consumer warpgroups (setmaxnreg 232), 64 query rows each:
//              Q [64 x HD] in registers as RS A fragments (loaded once from global);
//              S [64 x BK] = Q K^T: HD/16 wgmma m64n128k16, B = the K tile (K-major: rows of HD
//              values, two 64-column swizzled boxes for HD = 128);
//              causal mask on tiles crossing the diagonal, online softmax in registers (base 2,
//              as attn_flash_kernel); P re-packed from the S accumulators into A fragments;
//              O [64 x HD] += P V: BK/16 wgmma m64nHDk16 with B = the V tile read MN-major
//              (transposed B: HD contiguous per cache row; wgmma_desc_sw128_mn);
//              then one arrival per warp on the stage's `empty` mbarrier (8 per phase).
// Shared memory: S stages x (K tile + V tile) = S x 2 x BK x HD x 2 bytes (HD 128: 64 KiB per
// stage, 2 stages; HD 64: 32 KiB, 3 stages), 1024-aligned, plus 2S mbarriers.
// Accumulator layout (kernels/wgmma.cuh): warp w of a consumer warpgroup, lane 4g + t, register
// 4j + e = row 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1) -- the same per-warp layout as the
// mma.sync kernel's s[n][e] / o[n][e], so its softmax and store code carry over.
//
// PP (the launcher always sets it; PP = false is the same kernel without them): FA3's two schedules on top --
//   intra-warpgroup overlap: tile j's S = Q K_j^T is issued together with tile j-1's O += P V_{j-1}
//              (P kept from the previous iteration), so the tensor cores work on both while the
//              warpgroup waits for S_j and runs its softmax; O is rescaled once P V_{j-1} is done;
//   ping-pong: named barriers 2 and 3 order the two consumer warpgroups' GEMM issues (warpgroup 0,
//              then 1, then 0 ...), so one warpgroup's softmax runs while the other's GEMMs do.
//   K/V stay one stage per tile, released after P V_j; 3 stages for HD = 128 (192 KiB), 4 for 64,
//   producer 24 / consumers 240 registers.
#pragma once
#include <cuda.h>

#include "backend/cuda/kernels/attention_flash.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace nf4flash::cuda {

constexpr int kFlashWgBQ = 128, kFlashWgBK = 128, kFlashWgThreads = 384;
__host__ __device__ constexpr int flash_wg_stages(int hd, bool pp) { return (hd == 128 ? 2 : 3) + (pp ? 1 : 0); }
__host__ __device__ constexpr int flash_wg_smem_bytes(int hd, bool pp) {
  return 1024 + flash_wg_stages(hd, pp) * 2 * kFlashWgBK * hd * 2 + 2 * flash_wg_stages(hd, pp) * 8;
}

__device__ __forceinline__ void named_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

template <typename T, int HD, bool PP>
__global__ void __launch_bounds__(kFlashWgThreads, 1)
    attn_flash_wgmma_kernel(const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                            const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BQ = kFlashWgBQ, BK = kFlashWgBK, S = flash_wg_stages(HD, PP), KS = HD / 16, NB = HD / 64;
  constexpr int TILE = BK * HD * 2;  // bytes of one K (or V) tile; box r (64 columns) at r * BK * 128
  constexpr bool BF = std::is_same_v<T, __nv_bfloat16>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = smem_u32(smem_raw);
  const uint32_t base_s = (raw_s + 1023u) & ~1023u;
  const uint32_t k_s = base_s, v_s = base_s + S * TILE;  // K stage s at k_s + s * TILE, V likewise
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem_raw + (base_s - raw_s) + 2 * S * TILE);
  uint64_t* const empty = full + S;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.x, G = a.n_heads / a.n_kv, kvh = h / G;
  const int t0 = int(gridDim.y - 1 - blockIdx.y) * BQ;
  const int pos0 = a.pos0[0];
  const int rows = min(BQ, a.T - t0);
  const int kv_end = pos0 + t0 + rows;  // exclusive
  const int n_tiles = (kv_end + BK - 1) / BK;

  if (tid == 0) mbar_init_ring(full, empty, S, 8);
  __syncthreads();

  if (warp < 4) {  // ---- producer
    if constexpr (PP) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp == 0 && lane == 0) {
      const int row0 = int(int64_t(kvh) * a.capacity);
      for (int j = 0; j < n_tiles; ++j) {
        const int slot = j % S;
        if (j >= S) mbar_wait(&empty[slot], uint32_t((j / S) + 1) & 1u);
        mbar_expect_tx(&full[slot], uint32_t(2 * TILE));
#pragma unroll
        for (int r = 0; r < NB; ++r) {
          tma_load_2d(k_s + slot * TILE + r * BK * 128, &kmap, 64 * r, row0 + j * BK, &full[slot]);
          tma_load_2d(v_s + slot * TILE + r * BK * 128, &vmap, 64 * r, row0 + j * BK, &full[slot]);
        }
      }
    }
    return;
  }

  // ---- consumers
  if constexpr (PP) asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int cw = warp - 4, wg = cw >> 2, wq = cw & 3;  // warpgroup, warp within it
  const int g = lane >> 2, c = lane & 3;
  const int r_lo = t0 + 64 * wg + 16 * wq + g, r_hi = r_lo + 8;  // query rows of this lane
  const int q_lo = pos0 + r_lo, q_hi = pos0 + r_hi;
  const int block_qmin = pos0 + t0;
  const float sl2 = a.scale * 1.4426950408889634f;

  // Q fragments straight from global (rows past T read as zeros)
  uint32_t qf[KS][4];
  {
    const T* qg = static_cast<const T*>(a.q) + int64_t(h) * HD + 2 * c;
    const bool ok_lo = r_lo < a.T, ok_hi = r_hi < a.T;
    const uint32_t* qlo = reinterpret_cast<const uint32_t*>(qg + int64_t(ok_lo ? r_lo : 0) * a.q_stride);
    const uint32_t* qhi = reinterpret_cast<const uint32_t*>(qg + int64_t(ok_hi ? r_hi : 0) * a.q_stride);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      qf[ks][0] = ok_lo ? qlo[8 * ks] : 0u;
      qf[ks][1] = ok_hi ? qhi[8 * ks] : 0u;
      qf[ks][2] = ok_lo ? qlo[8 * ks + 4] : 0u;
      qf[ks][3] = ok_hi ? qhi[8 * ks + 4] : 0u;
    }
  }

  float o[HD / 2];
#pragma unroll
  for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  float s[BK / 2];
  uint32_t pa[BK / 16][4];

  // S = Q K_j^T issued (waits for tile j's copies first); completes with the next commit group
  auto issue_s = [&](int j) {
    const uint32_t sk = k_s + (j % S) * TILE;
    mbar_wait(&full[j % S], uint32_t(j / S) & 1u);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      wgmma_rs<BK, BF>(s, qf[ks], wgmma_desc_sw128(sk + (ks >> 2) * BK * 128 + (ks & 3) * 32), ks > 0 ? 1 : 0);
    wgmma_commit();
  };
  // O += P V_j issued (P as A fragments: K step kp = columns 16kp .. 16kp + 15 of S; V read
  // MN-major, 16 cache rows per step = 2048 bytes into each box)
  auto issue_pv = [&](int j) {
    const uint32_t sv = v_s + (j % S) * TILE;
    wgmma_fence_regs(o);
    wgmma_fence();
#pragma unroll
    for (int kp = 0; kp < BK / 16; ++kp)
      wgmma_rs<HD, BF, true>(o, pa[kp], wgmma_desc_sw128_mn(sv + kp * 2048, BK * 128, 1024), 1);
    wgmma_commit();
  };
  // causal mask (tiles crossing the diagonal), online softmax; returns the O correction
  auto softmax = [&](int j, float& corr_lo, float& corr_hi) {
    const int kb = j * BK;
    if (kb + BK - 1 > block_qmin) {
#pragma unroll
      for (int n = 0; n < BK / 8; ++n) {
        const int p = kb + n * 8 + 2 * c;
        if (p > q_lo) s[4 * n] = -INFINITY;
        if (p + 1 > q_lo) s[4 * n + 1] = -INFINITY;
        if (p > q_hi) s[4 * n + 2] = -INFINITY;
        if (p + 1 > q_hi) s[4 * n + 3] = -INFINITY;
      }
    }
    flash_softmax_tile<BK / 8>([&](int n, int e) -> float& { return s[4 * n + e]; }, sl2, m_lo, m_hi, l_lo, l_hi,
                               corr_lo, corr_hi);
  };
  auto rescale = [&](float corr_lo, float corr_hi) {
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[4 * n] *= corr_lo;
      o[4 * n + 1] *= corr_lo;
      o[4 * n + 2] *= corr_hi;
      o[4 * n + 3] *= corr_hi;
    }
  };
  auto pack_p = [&] {
#pragma unroll
    for (int kp = 0; kp < BK / 16; ++kp) {
      pa[kp][0] = pack2<T>(s[8 * kp], s[8 * kp + 1]);
      pa[kp][1] = pack2<T>(s[8 * kp + 2], s[8 * kp + 3]);
      pa[kp][2] = pack2<T>(s[8 * kp + 4], s[8 * kp + 5]);
      pa[kp][3] = pack2<T>(s[8 * kp + 6], s[8 * kp + 7]);
    }
  };
  auto release = [&](int j) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[j % S]);
  };

  float corr_lo, corr_hi;
  if constexpr (!PP) {
    for (int j = 0; j < n_tiles; ++j) {
      issue_s(j);
      wgmma_wait<0>();
      wgmma_fence_regs(s);
      softmax(j, corr_lo, corr_hi);
      rescale(corr_lo, corr_hi);
      pack_p();
      issue_pv(j);
      wgmma_wait<0>();
      wgmma_fence_regs(o);
      release(j);
    }
  } else {
    // ping-pong: warpgroup w issues its GEMMs after bar.sync (2 + w) and lets the other one go
    // with bar.arrive on its barrier; warpgroup 1 opens warpgroup 0's first turn and skips the
    // arrive after its last issue (every sync meets exactly one arrive)
    const int my_bar = 2 + wg, other_bar = 3 - wg;
    if (wg == 1) named_bar_arrive(2, 256);
    named_bar_sync(my_bar, 256);
    issue_s(0);
    if (wg == 0 || n_tiles > 1) named_bar_arrive(other_bar, 256);
    wgmma_wait<0>();
    wgmma_fence_regs(s);
    softmax(0, corr_lo, corr_hi);  // (O is zero: no rescale)
    pack_p();
    for (int j = 1; j < n_tiles; ++j) {
      named_bar_sync(my_bar, 256);
      issue_s(j);
      issue_pv(j - 1);
      if (wg == 0 || j + 1 < n_tiles) named_bar_arrive(other_bar, 256);
      wgmma_wait<1>();  // S_j done (P V_{j-1} may still run: it reads pa, writes o)
      wgmma_fence_regs(s);
      softmax(j, corr_lo, corr_hi);
      wgmma_wait<0>();
      wgmma_fence_regs(o);
      release(j - 1);
      rescale(corr_lo, corr_hi);
      pack_p();
    }
    issue_pv(n_tiles - 1);
    wgmma_wait<0>();
    wgmma_fence_regs(o);
    release(n_tiles - 1);
  }

  // ---- normalize and store
#pragma unroll
  for (int o2 = 1; o2 < 4; o2 <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, o2);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, o2);
  }
  const float inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f, inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
  T* og = static_cast<T*>(a.out) + int64_t(h) * HD + 2 * c;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    if (r_lo < a.T)
      *reinterpret_cast<uint32_t*>(og + int64_t(r_lo) * a.out_stride + n * 8) = pack2<T>(o[4 * n] * inv_lo, o[4 * n + 1] * inv_lo);
    if (r_hi < a.T)
      *reinterpret_cast<uint32_t*>(og + int64_t(r_hi) * a.out_stride + n * 8) = pack2<T>(o[4 * n + 2] * inv_hi, o[4 * n + 3] * inv_hi);
  }
#else
  __trap();  // built only for sm_90a (attention_flash_wgmma_supported() says so before any launch)
#endif
}

}  // namespace nf4flash::cuda
