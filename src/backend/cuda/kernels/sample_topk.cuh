// Sampling on the GPU: repetition penalty, temperature, top-k, top-p, min-p and the draw with the
// host's uniform u, picking exactly the id of sample_with_uniform() (sampling/sampler.h) up to the
// rounding of double sums (a different summation order moves a cumulative boundary by ~1e-16).
//
// Inputs: logits f32 [V] (device), history ids int32 [nh] (device copy), params, u. Output: the id
// (int32, device). Workspace (SampleWs, one buffer of sample_workspace_bytes(V), zeroed once):
//   s    f32 [V]  scaled logits s_i = penalized(l_i) / T, NaN -> -inf
//   w    f64 [V]  weights w_i = s_i == mx ? 1 : exp(double(s_i - mx)) inside top-k, else 0
//   bits u32 [V/32] history marks (all zero between calls: the prep kernel clears what it reads)
//   per-block partials of the multi-block kernels, the top-k threshold key, the id.
// Order key of a token (descending key = s descending, then id ascending; -0 counts as +0):
//   key_i = ordered_bits(s_i) << 32 | ~i          (u64, unique per token)
//
// Launches (launcher: ops_sample.cu):
//   mark    (history)      s[h] = penalized(l[h]) / T for h in history; bits[h] = 1 (the history's
//                          count from the host, or from the device in the pipelined decode loop)
//   prep    (256 blocks)   s[i] = l[i] / T for unmarked i (clears the marks); per-block max/min
//   small   (1 block)      0 < top_k <= kGather: top-k select, then everything in shared memory
// or
//   topk    (1 block)      top_k > kGather: the threshold key of the k-th largest token
//   weights (256 blocks)   w[i] for key_i >= threshold; per-block sum Z, count, min s
//   final   (1 block)      top-p select over w; kept set <= kGather: in shared memory, else two
//                          passes over segments of ascending ids (chunk sums, scan, one warp walks)
// Select (block_select): radix-like search for the first token, in descending key order, whose
// inclusive cumulative weight (1 per token for top-k, w for top-p) reaches the target. Each pass
// histograms the candidates into 256 buckets, monotone in key (the first pass: linear bins of s
// between the max and the min, so that tokens spread out; later passes: linear in key between the
// min and max key of the chosen bucket), with per-warp private count/mass rows (match_any groups:
// one leader adds a group's count and mass, so sums run in a fixed order: deterministic), then
// warp 0 walks the buckets from the top. When the chosen bucket holds <= kGather tokens they are
// gathered into shared memory, sorted (bitonic) and scanned.
#pragma once
#include "backend/cuda/kernels/sample_select.cuh"

namespace nf4flash::cuda {

// ---- mark and prep (multi-block) ------------------------------------------------------------
__global__ void __launch_bounds__(256) sample_mark_kernel(SampleKArgs a) {
  pdl_trigger();
  pdl_wait();
  const int nh = a.nh_dev ? min(*a.nh_dev, a.nh) : a.nh;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < nh; j += gridDim.x * blockDim.x) {
    const int h = a.hist[j];
    if (h < 0 || h >= a.V) continue;
    const float l = a.logits[h];
    const float p = l < 0.f ? __fmul_rn(l, a.pen) : __fdiv_rn(l, a.pen);
    a.ws.s[h] = canon(__fdiv_rn(p, a.T));  // duplicates write the same value
    atomicOr(&a.ws.bits[h >> 5], 1u << (h & 31));
  }
}

__global__ void __launch_bounds__(256) sample_prep_kernel(SampleKArgs a, bool marked) {
  pdl_trigger();
  pdl_wait();
  __shared__ float smx[8], smn[8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float mx = -INFINITY, mn = INFINITY;
  for (int base = blockIdx.x * 256 + warp * 32; base < a.V; base += kSamplePrepBlocks * 256) {
    const int i = base + lane;
    const uint32_t word = marked ? a.ws.bits[base >> 5] : 0u;
    if (i < a.V) {
      float v;
      if ((word >> lane) & 1u) {
        v = a.ws.s[i];
      } else {
        v = canon(__fdiv_rn(a.logits[i], a.T));
        a.ws.s[i] = v;
      }
      mx = fmaxf(mx, v);
      if (v > -INFINITY && v < INFINITY) mn = fminf(mn, v);
    }
    if (marked) {
      __syncwarp();
      if (lane == 0 && word) a.ws.bits[base >> 5] = 0u;
    }
  }
  mx = warp_max(mx);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
  if (lane == 0) { smx[warp] = mx; smn[warp] = mn; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < 8; ++w) { mx = fmaxf(mx, smx[w]); mn = fminf(mn, smn[w]); }
    a.ws.pmax[blockIdx.x] = mx;
    a.ws.pmin[blockIdx.x] = mn;
  }
}

// Dynamic shared memory: the launcher opts in to sizeof(SelSmem).
__global__ void __launch_bounds__(kSelThreads, 1) sample_small_kernel(SampleKArgs a) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  SelSmem& sm = *reinterpret_cast<SelSmem*>(smem_raw);
  reduce_prep_partials(sm, a.ws);
  const float mx = sm.f_mx, mn = sm.f_mn;
  SelResult r = block_select<false>(sm, a.ws.s, nullptr, a.V, mx, mn, double(a.top_k), true, a.V);
  if (r.n_list < a.top_k) {  // not expected (top_k <= kGather): gather the kept set from the top
    __syncthreads();
    r.n_list = gather_sorted<false>(sm, a.ws.s, nullptr, a.V, r.K, ~0ull);
  }
  small_finish(sm, min(a.top_k, r.n_list), mx, a.top_p < 1.f, a.top_p, a.min_p, a.u, a.ws.out);
}

__global__ void __launch_bounds__(kSelThreads, 1) sample_topk_kernel(SampleKArgs a) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  SelSmem& sm = *reinterpret_cast<SelSmem*>(smem_raw);
  reduce_prep_partials(sm, a.ws);
  const SelResult r = block_select<false>(sm, a.ws.s, nullptr, a.V, sm.f_mx, sm.f_mn, double(a.top_k), false, a.V);
  if (threadIdx.x == 0) *a.ws.kk = r.K;
}

// ---- weights (multi-block) ----------------------------------------------------------------------
__global__ void __launch_bounds__(256) sample_weights_kernel(SampleKArgs a, bool use_kk) {
  pdl_trigger();
  pdl_wait();
  __shared__ float sf[8];
  __shared__ double sd[8];
  __shared__ int si[8];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  float mx = t < kSamplePrepBlocks ? a.ws.pmax[t] : -INFINITY;
  mx = warp_max(mx);
  if (lane == 0) sf[warp] = mx;
  __syncthreads();
  mx = sf[0];
  for (int q = 1; q < 8; ++q) mx = fmaxf(mx, sf[q]);
  __syncthreads();
  const unsigned long long kk = use_kk ? *a.ws.kk : 0ull;
  double z = 0.0;
  int c = 0;
  float mn = INFINITY;
  for (int i = blockIdx.x * 256 + t; i < a.V; i += gridDim.x * 256) {
    const float sv = a.ws.s[i];
    const double wv = skey(sv, i) >= kk ? wfun(sv, mx) : 0.0;
    a.ws.w[i] = wv;
    z += wv;
    if (wv > 0.0) {
      ++c;
      if (sv > -INFINITY) mn = fminf(mn, sv);
    }
  }
  z = warp_sum_d(z);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    c += __shfl_xor_sync(0xffffffffu, c, o);
    mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
  }
  if (lane == 0) { sd[warp] = z; si[warp] = c; sf[warp] = mn; }
  __syncthreads();
  if (t == 0) {
    for (int q = 1; q < 8; ++q) { z += sd[q]; c += si[q]; mn = fminf(mn, sf[q]); }
    a.ws.pz[blockIdx.x] = z;
    a.ws.pc[blockIdx.x] = c;
    a.ws.pmn[blockIdx.x] = mn;
  }
}

// ---- final (single block): top-p and the draw ---------------------------------------------------
__global__ void __launch_bounds__(kSelThreads, 1) sample_final_kernel(SampleKArgs a) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  SelSmem& sm = *reinterpret_cast<SelSmem*>(smem_raw);
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  reduce_prep_partials(sm, a.ws);
  const float mx = sm.f_mx;
  // Z, the count of w > 0 and their min s, in a fixed order
  {
    double z = t < kSamplePrepBlocks ? a.ws.pz[t] : 0.0;
    int c = t < kSamplePrepBlocks ? a.ws.pc[t] : 0;
    float mn = t < kSamplePrepBlocks ? a.ws.pmn[t] : INFINITY;
    z = warp_sum_d(z);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      c += __shfl_xor_sync(0xffffffffu, c, o);
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    }
    if (lane == 0) { sm.red[warp] = z; sm.redi[warp] = c; sm.redf[warp] = mn; }
    __syncthreads();
    if (t == 0) {
      for (int q = 1; q < kSelWarps; ++q) { z += sm.red[q]; c += sm.redi[q]; mn = fminf(mn, sm.redf[q]); }
      sm.f_a = z;
      sm.f_cnt = c;
      sm.f_mn = mn;
    }
    __syncthreads();
  }
  const double Z = sm.f_a;
  const int n_pos = sm.f_cnt;
  SelResult sel{0ull, n_pos, 0, false};
  if (a.top_p < 1.f) sel = block_select<true>(sm, a.ws.s, a.ws.w, a.V, mx, sm.f_mn, double(a.top_p) * Z, false, n_pos);
  const unsigned long long kp = sel.K;
  __syncthreads();
  if (sel.kept <= kGather) {  // the kept set (before min-p) fits in shared memory
    const bool have = sel.n_list > 0 && sel.top && sel.kept <= sel.n_list;
    const int n = have ? sel.kept : gather_sorted<true>(sm, a.ws.s, a.ws.w, a.V, kp, ~0ull);
    small_finish(sm, n, mx, false, 1.f, a.min_p, a.u, a.ws.out);
    return;
  }
  // many kept tokens: segments of S ascending ids, their kept mass, a scan, one warp walks
  const int S = max(32, ((a.V + kGather - 1) / kGather + 31) & ~31);
  const int nseg = (a.V + S - 1) / S;
  const double min_p = a.min_p;
  auto kept_w = [&](int i) -> double {
    if (i >= a.V) return 0.0;
    const double wv = a.ws.w[i];
    return wv > 0.0 && wv >= min_p && skey(a.ws.s[i], i) >= kp ? wv : 0.0;
  };
  auto& g = sm.u.g;
  for (int seg = warp; seg < nseg; seg += kSelWarps) {
    double acc = 0.0;
    for (int it = 0; it < S; it += 32) acc += kept_w(seg * S + it + lane);
    acc = warp_sum_d(acc);
    if (lane == 0) g.x[seg] = acc;
  }
  __syncthreads();
  block_scan(sm, g.x, g.ex, nseg);
  const double r = double(a.u) * sm.total;
  int seg = block_first(sm, nseg, [&](int q) { return g.x[q] > 0.0 && g.ex[q] + g.x[q] > r; });
  const bool take_last = seg < 0;
  if (take_last) {
    if (t == 0) sm.imax = -1;
    __syncthreads();
    for (int q = t; q < nseg; q += kSelThreads)
      if (g.x[q] > 0.0) atomicMax(&sm.imax, q);
    __syncthreads();
    seg = max(sm.imax, 0);
  }
  if (warp == 0) {
    double run = g.ex[seg];
    int found = -1, last = -1;
    for (int it = 0; it < S && found < 0; it += 32) {
      const int i = seg * S + it + lane;
      const double v = kept_w(i);
      const double c = warp_incl_scan_d(v);
      const unsigned hit = __ballot_sync(0xffffffffu, !take_last && v > 0.0 && run + c > r);
      const unsigned pos = __ballot_sync(0xffffffffu, v > 0.0);
      if (hit) found = seg * S + it + __ffs(hit) - 1;
      if (pos) last = seg * S + it + 31 - __clz(pos);
      run += __shfl_sync(0xffffffffu, c, 31);
    }
    if (lane == 0) *a.ws.out = found >= 0 ? found : max(last, 0);
  }
}

}  // namespace nf4flash::cuda
