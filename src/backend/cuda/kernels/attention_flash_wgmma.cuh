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
// Sliding window (AttnArgs::window): the block's tiles start at its first row's first visible key
// (tile j of the loops is KV tile j0 + j); keys before a row's window are masked. Soft-capping
// (AttnArgs::softcap): scores become softcap * tanh(s * scale / softcap) before the softmax.
// HD 64, 128 and 256 (attention_flash_wgmma_head_dim); the mma.sync kernel takes the others. At
// HD 256 the KV tiles are 64 rows (BK, flash_wg_bk) in 2 stages, and Q -- 64 registers a thread
// as fragments -- is staged in shared memory by the producer (a third tensor map over q, boxes of
// 64 columns x 64 rows, zeros past T) and read by the SS form of the S product; shared memory
// 2 x 64 KiB of K/V + 64 KiB of Q.
#pragma once
#include <cuda.h>

#include "backend/cuda/kernels/attention_flash.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace nf4flash::cuda {

constexpr int kFlashWgBQ = 128, kFlashWgBK = 128, kFlashWgThreads = 384;
// KV tile rows: 128, or 64 at head_dim 256 (the S and P registers beside the 64 x 256 O accumulator)
__host__ __device__ constexpr int flash_wg_bk(int hd) { return hd > 128 ? 64 : kFlashWgBK; }
__host__ __device__ constexpr int flash_wg_stages(int hd, bool pp) {
  return hd > 128 ? 2 : (hd == 128 ? 2 : 3) + (pp ? 1 : 0);
}
// Q staged in shared memory (head_dim 256: the SS product), [2 warpgroups][HD/64 boxes][64 rows][128 B]
__host__ __device__ constexpr int flash_wg_q_bytes(int hd) { return hd > 128 ? kFlashWgBQ * hd * 2 : 0; }
__host__ __device__ constexpr int flash_wg_smem_bytes(int hd, bool pp) {
  return 1024 + flash_wg_stages(hd, pp) * 2 * flash_wg_bk(hd) * hd * 2 + flash_wg_q_bytes(hd) +
         (2 * flash_wg_stages(hd, pp) + 1) * 8;
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
                            const __grid_constant__ CUtensorMap qmap, const AttnArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BQ = kFlashWgBQ, BK = flash_wg_bk(HD), S = flash_wg_stages(HD, PP), KS = HD / 16, NB = HD / 64;
  constexpr int TILE = BK * HD * 2;  // bytes of one K (or V) tile; box r (64 columns) at r * BK * 128
  constexpr bool BF = std::is_same_v<T, __nv_bfloat16>;
  constexpr bool Q_SS = HD > 128;  // Q from shared memory (TMA, qmap) instead of registers
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = smem_u32(smem_raw);
  const uint32_t base_s = (raw_s + 1023u) & ~1023u;
  const uint32_t k_s = base_s, v_s = base_s + S * TILE;  // K stage s at k_s + s * TILE, V likewise
  const uint32_t q_s = base_s + 2 * S * TILE;            // Q_SS: warpgroup w's 64 rows at q_s + w * 64 * HD * 2
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem_raw + (base_s - raw_s) + 2 * S * TILE + flash_wg_q_bytes(HD));
  uint64_t* const empty = full + S;
  uint64_t* const q_full = empty + S;  // Q_SS: Q's copies landed

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.x, G = a.n_heads / a.n_kv, kvh = h / G;
  const int t0 = int(gridDim.y - 1 - blockIdx.y) * BQ;
  const int pos0 = a.pos0[0];
  const int rows = min(BQ, a.T - t0);
  const int kv_end = pos0 + t0 + rows;  // exclusive
  // sliding window: the tiles read start at the one holding the block's first row's first key
  const int W = a.window;
  const int j0 = attn_first_key(pos0 + t0 + 1, W) / BK;
  const int n_tiles = (kv_end + BK - 1) / BK - j0;  // tile j of the loops is KV tile j0 + j

  if (tid == 0) {
    if constexpr (Q_SS) mbar_init(q_full, 1);
    mbar_init_ring(full, empty, S, 8);  // (its fence covers q_full too)
  }
  __syncthreads();

  if (warp < 4) {  // ---- producer
    if constexpr (PP) asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp == 0 && lane == 0) {
      if constexpr (Q_SS) {  // the block's Q rows (past T: zeros), box r of warpgroup w at columns h*HD + 64r
        mbar_expect_tx(q_full, uint32_t(BQ * HD * 2));
#pragma unroll
        for (int w = 0; w < 2; ++w)
#pragma unroll
          for (int r = 0; r < NB; ++r)
            tma_load_2d(q_s + w * 64 * HD * 2 + r * 64 * 128, &qmap, h * HD + 64 * r, t0 + 64 * w, q_full);
      }
      const int row0 = int(int64_t(kvh) * a.capacity);
      for (int j = 0; j < n_tiles; ++j) {
        const int slot = j % S;
        if (j >= S) mbar_wait(&empty[slot], uint32_t((j / S) + 1) & 1u);
        mbar_expect_tx(&full[slot], uint32_t(2 * TILE));
#pragma unroll
        for (int r = 0; r < NB; ++r) {
          tma_load_2d(k_s + slot * TILE + r * BK * 128, &kmap, 64 * r, row0 + (j0 + j) * BK, &full[slot]);
          tma_load_2d(v_s + slot * TILE + r * BK * 128, &vmap, 64 * r, row0 + (j0 + j) * BK, &full[slot]);
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
  const bool capped = a.softcap > 0.f;
  const float sl2 = capped ? 1.4426950408889634f : a.scale * 1.4426950408889634f;
  const float cap_in = capped ? a.scale / a.softcap : 0.f;
  const int lo_lo = W > 0 ? q_lo - W + 1 : 0, lo_hi = W > 0 ? q_hi - W + 1 : 0;  // first visible keys

  // Q fragments straight from global (rows past T read as zeros); Q_SS: Q in shared memory
  uint32_t qf[Q_SS ? 1 : KS][4];
  if constexpr (Q_SS) {
    mbar_wait(q_full, 0);
  } else {
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
    for (int ks = 0; ks < KS; ++ks) {
      const uint64_t kd = wgmma_desc_sw128(sk + (ks >> 2) * BK * 128 + (ks & 3) * 32);
      if constexpr (Q_SS)
        wgmma_ss<BK, BF>(s, wgmma_desc_sw128(q_s + wg * 64 * HD * 2 + (ks >> 2) * 64 * 128 + (ks & 3) * 32), kd, ks > 0 ? 1 : 0);
      else
        wgmma_rs<BK, BF>(s, qf[Q_SS ? 0 : ks], kd, ks > 0 ? 1 : 0);
    }
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
  // soft-capping, causal mask (tiles crossing the diagonal), window mask (tiles crossing a row's
  // window edge), online softmax; returns the O correction
  auto softmax = [&](int j, float& corr_lo, float& corr_hi) {
    const int kb = (j0 + j) * BK;
    if (capped) {
#pragma unroll
      for (int i = 0; i < BK / 2; ++i) s[i] = a.softcap * tanhf(s[i] * cap_in);
    }
    if (W > 0 && kb < lo_hi) {
#pragma unroll
      for (int n = 0; n < BK / 8; ++n) {
        const int p = kb + n * 8 + 2 * c;
        if (p < lo_lo) s[4 * n] = -INFINITY;
        if (p + 1 < lo_lo) s[4 * n + 1] = -INFINITY;
        if (p < lo_hi) s[4 * n + 2] = -INFINITY;
        if (p + 1 < lo_hi) s[4 * n + 3] = -INFINITY;
      }
    }
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
