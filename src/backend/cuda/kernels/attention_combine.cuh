// attn_combine_wide_kernel: the decode splits' merge (the active splits' workspace partials (m, l,
// acc[HD]) of one (head, token), written by attn_decode_kernel -> out), with the split loads in
// flight together.
//
//   out[t, h, d] = sum_s c_s acc_s[d] / sum_s c_s l_s,   c_s = 2^(m_s - M), M = max_s m_s
//
// Grid (n_heads, T), 128 threads = 4 groups of 32 lanes. Thread s < nact loads split s's (m, l);
// group g takes the splits g, g + 4, g + 8, ... and lane l its dims DPL*l .. DPL*l + DPL-1
// (DPL = ceil(HD/32): one 16-byte load at HD 128, 8 bytes at HD 64, two 16-byte loads at HD 256,
// scalar loads at HD 32, 80 and 96, lanes past HD loading nothing), up to 16 splits per group and
// batch (8 at HD 256), all issued before any is used: nact <= 64 costs one round trip to L2 (with
// the (m, l) loads), <= 128 two. (A merge that loaded the partials 8 splits at a time took ~15 dependent L2
// round trips at 66 splits: 3.9-6.6 us per launch at ctx 32768 on the H200; this kernel: H100,
// decode @512 / @32768 +2.0% / +4.1% end to end.)
// PAGED: the rows of a paged step (AttnArgs::paged); rows the decode kernel skipped are left alone.
// Sums: each group over its splits in order, then the groups 0..3 in order (deterministic).
#pragma once
#include "backend/cuda/kernels/attention.cuh"

namespace nf4flash::cuda {

template <int N>
struct CombineVec { float v[N]; };

// Lane `lane`'s N floats of one partial acc[HD] (dims N*lane ..): vector loads where HD = 32 N
// with N 2, 4 or 8 and p is aligned to them (vec), else scalar loads of the dims below HD, zero
// past it (the partials start at an odd float offset when T * n_heads * nsplit is odd)
template <int N, int HD>
__device__ __forceinline__ CombineVec<N> ldcg_vec(const float* acc, int lane, bool vec) {
  CombineVec<N> r;
  const float* p = acc + N * lane;
  constexpr bool VEC = HD == 32 * N && (N == 2 || N == 4 || N == 8);
  if (!VEC || !vec) {
#pragma unroll
    for (int i = 0; i < N; ++i) r.v[i] = N * lane + i < HD ? __ldcg(p + i) : 0.f;
  } else if constexpr (N == 8) {
    const float4 x = __ldcg(reinterpret_cast<const float4*>(p)), y = __ldcg(reinterpret_cast<const float4*>(p + 4));
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w, r.v[4] = y.x, r.v[5] = y.y, r.v[6] = y.z, r.v[7] = y.w;
  } else if constexpr (N == 4) {
    const float4 x = __ldcg(reinterpret_cast<const float4*>(p));
    r.v[0] = x.x, r.v[1] = x.y, r.v[2] = x.z, r.v[3] = x.w;
  } else if constexpr (N == 2) {
    const float2 x = __ldcg(reinterpret_cast<const float2*>(p));
    r.v[0] = x.x, r.v[1] = x.y;
  }
  return r;
}

template <typename TA, int HD, bool PAGED = false>
__global__ void __launch_bounds__(128) attn_combine_wide_kernel(const AttnArgs a, int nsplit, int T) {
  pdl_trigger();
  pdl_wait();
  // B splits per group and batch in flight (8 at head_dim 256: 16 x 8 floats would spill)
  constexpr int NG = 4, B = HD > 128 ? 8 : 16, DPL = (HD + 31) / 32;
  static_assert(kDecodeMaxSplits <= 128, "one thread per split loads its (m, l)");
  __shared__ float s_c[kDecodeMaxSplits];
  __shared__ float s_red[NG][HD];
  __shared__ float s_w[NG];
  const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, lane = tid & 31, g = tid >> 5;
  const SplitPartials sp = split_partials<PAGED>(a, nsplit, T, t, h);
  if (PAGED && sp.nact == 0) return;  // a row the paged decode kernel skipped
  const float *ws_ml = sp.ml, *ws_acc = sp.acc;
  const int64_t base = sp.base;
  const int nact = sp.nact;
  const bool vec = reinterpret_cast<uintptr_t>(ws_acc) % (4 * (DPL < 4 ? DPL : 4)) == 0;  // HD is a multiple of DPL where loads are vectors
  float ms = -INFINITY, ls = 0.f;
  if (tid < nact) {
    ms = __ldcg(ws_ml + (base + tid) * 2);
    ls = __ldcg(ws_ml + (base + tid) * 2 + 1);
  }
  CombineVec<DPL> v[B];
  auto load_batch = [&](int j0) {  // this group's splits g + NG*(j0 + j), j < B
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int s = g + NG * (j0 + j);
      if (s < nact) v[j] = ldcg_vec<DPL, HD>(ws_acc + (base + s) * HD, lane, vec);
    }
  };
  load_batch(0);
  // M = max_s m_s, then c_s and sum_s c_s l_s (warp, then the 4 warps in order)
  float M = warp_max(ms);
  if (lane == 0) s_w[g] = M;
  __syncthreads();
  M = fmaxf(fmaxf(s_w[0], s_w[1]), fmaxf(s_w[2], s_w[3]));
  const float c = (ms == -INFINITY) ? 0.f : exp2f(ms - M);
  if (tid < nact) s_c[tid] = c;
  const float wl = warp_sum(c * ls);
  __syncthreads();  // s_w read by all before it is reused
  if (lane == 0) s_w[g] = wl;
  __syncthreads();
  const float inv_l = 1.f / (((s_w[0] + s_w[1]) + s_w[2]) + s_w[3]);
  float acc[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) acc[i] = 0.f;
  for (int j0 = 0;; j0 += B) {
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const int s = g + NG * (j0 + j);
      if (s < nact) {
        const float cs = s_c[s];
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] = fmaf(cs, v[j].v[i], acc[i]);
      }
    }
    if (g + NG * (j0 + B) >= nact) break;
    load_batch(j0 + B);
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i)
    if (DPL * lane + i < HD) s_red[g][DPL * lane + i] = acc[i];
  __syncthreads();
  for (int d = tid; d < HD; d += 128) {
    const float o = ((s_red[0][d] + s_red[1][d]) + s_red[2][d]) + s_red[3][d];
    static_cast<TA*>(a.out)[int64_t(t) * a.out_stride + int64_t(h) * HD + d] = from_f32<TA>(o * inv_l);
  }
}

}  // namespace nf4flash::cuda
