// Weight prefetch into L2 across kernel boundaries for the captured decode step.
//
// The decode step's weight-streaming launches form a "virtual stream": launch k owns the virtual
// bytes [vstart, vstart + vlen), its weights in the order its work units consume them. A launch is
// up to kPfMaxGroups groups consumed one after the other (q, k, v of a fused launch); a group is up
// to kPfMaxRanges byte ranges consumed in lockstep (a weight's code tiles and its absmax; gate and
// up of a SwiGLU launch), so virtual position p of a group maps to the same fraction p / vlen of
// each of its ranges. The host fills the table once the step is captured (cuda_backend: pf_*).
//
// A launch whose work unit u covers virtual [v0, v1) asks the L2 for [v0 + dist, v1 + dist): the
// bytes `dist` ahead, usually in the next launches, with cp.async.bulk.prefetch.L2 (fire and
// forget: no registers, no shared memory, no completion to wait for). So HBM keeps streaming the
// next weights through the current launch's tail, the small kernels between launches and the next
// launch's start, and the next launch reads them from L2. The first `dist` bytes of a step are not
// prefetched (the lm_head before them has just evicted the L2).
#pragma once
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

// A kernel copies its own descriptor and the next kPfLook - 1 into shared memory at its start
// (the table ends with zeroed entries: ng == 0).
constexpr int kPfLook = kPfLookHost;

__device__ __forceinline__ void l2pf_bulk(const uint8_t* p, int64_t n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int64_t o = 0; o < n; o += 65536) {
    const int64_t rem = n - o;
    const uint32_t len = uint32_t(rem < 65536 ? rem : 65536);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + o), "r"(len) : "memory");
  }
#endif
}

// Block-cooperative copy of the descriptors pf[0 .. kPfLook) into shared memory (call before a
// barrier); a null pf leaves s_pf[0].ng = 0 (nothing to prefetch).
__device__ __forceinline__ void l2pf_load(const L2PfLaunch* pf, L2PfLaunch* s_pf) {
  static_assert(sizeof(L2PfLaunch) % 16 == 0, "descriptor size");
  constexpr int n16 = int(kPfLook * sizeof(L2PfLaunch) / 16);
  if (!pf) {
    if (threadIdx.x == 0) s_pf[0].ng = 0;
    return;
  }
  const uint4* src = reinterpret_cast<const uint4*>(pf);
  uint4* dst = reinterpret_cast<uint4*>(s_pf);
  for (int i = threadIdx.x; i < n16; i += blockDim.x) dst[i] = __ldg(src + i);
}

// One thread: prefetch the virtual bytes [a, b) (absolute positions) through the descriptors in
// shared memory. Each range piece is widened to 128-byte lines and clipped to its range (whose
// length is a multiple of 16, as cp.async.bulk needs).
__device__ __forceinline__ void l2pf_issue(const L2PfLaunch* s_pf, int64_t a, int64_t b) {
  for (int i = 0; i < kPfLook; ++i) {
    const L2PfLaunch& L = s_pf[i];
    if (L.ng == 0 || a >= b) return;
    const int64_t lo = max(a, L.vstart), hi = min(b, L.vstart + L.vlen);
    if (lo < hi) {
      int64_t gs = L.vstart;
      for (int gi = 0; gi < L.ng; ++gi) {
        const L2PfGroup& G = L.g[gi];
        const int64_t glo = max(lo, gs) - gs, ghi = min(hi, gs + G.vlen) - gs;
        if (glo < ghi) {
          for (int r = 0; r < G.nr; ++r) {
            const int64_t len = G.r[r].len;
            const int64_t s = (glo * len / G.vlen) & ~int64_t(127);
            const int64_t e = min(len, ((ghi * len + G.vlen - 1) / G.vlen + 127) & ~int64_t(127));
            if (e > s) l2pf_bulk(G.r[r].ptr + s, e - s);
          }
        }
        gs += G.vlen;
      }
    }
  }
}

// Prefetch for work unit u of `units` equal units of the launch described by s_pf[0].
__device__ __forceinline__ void l2pf_unit(const L2PfLaunch* s_pf, int64_t u, int64_t units) {
  const L2PfLaunch& L = s_pf[0];
  if (L.ng == 0 || L.dist <= 0) return;
  const int64_t v0 = L.vstart + u * L.vlen / units, v1 = L.vstart + (u + 1) * L.vlen / units;
  l2pf_issue(s_pf, v0 + L.dist, v1 + L.dist);
}

}  // namespace nf4flash::cuda
