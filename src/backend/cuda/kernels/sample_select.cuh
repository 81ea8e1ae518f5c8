// The single-block selection of the sampling kernels (the search for the token where a cumulative
// weight reaches a target, with the gather, sort and scan of short candidate lists), and the
// workspace, arguments and per-token helpers every sampling kernel shares. The kernels and the
// whole algorithm: kernels/sample_topk.cuh.
#pragma once
#include <cfloat>
#include <climits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/launchers.h"

namespace nf4flash::cuda {

constexpr int kSelThreads = 512, kSelWarps = kSelThreads / 32;
constexpr int kBuckets = 256;
constexpr int kGather = 1024;         // largest candidate list kept in shared memory
constexpr int kSamplePrepBlocks = 256;  // <= the 256 threads of the weights kernel and 512 of the others
static_assert(kSamplePrepBlocks <= 256, "partials are reduced by one block");

struct SampleWs {
  float* s;
  double* w;
  uint32_t* bits;
  float *pmax, *pmin, *pmn;
  double* pz;
  int* pc;
  void* amax;                  // argmax partials (2 * kArgmaxBlocks)
  unsigned long long* kk;      // top-k threshold key
  int32_t* out;
};

// Layout of the workspace for V tokens at `base` (null: sizes only); returns the bytes.
inline size_t sample_ws_layout(void* base, int64_t V, SampleWs* ws) {
  size_t off = 0;
  auto take = [&](size_t bytes) {
    char* p = base ? static_cast<char*>(base) + off : nullptr;
    off += (bytes + 255) & ~size_t(255);
    return p;
  };
  SampleWs l;
  l.s = reinterpret_cast<float*>(take(size_t(V) * 4));
  l.w = reinterpret_cast<double*>(take(size_t(V) * 8));
  l.bits = reinterpret_cast<uint32_t*>(take(size_t((V + 31) / 32) * 4));
  l.pmax = reinterpret_cast<float*>(take(kSamplePrepBlocks * 4));
  l.pmin = reinterpret_cast<float*>(take(kSamplePrepBlocks * 4));
  l.pmn = reinterpret_cast<float*>(take(kSamplePrepBlocks * 4));
  l.pz = reinterpret_cast<double*>(take(kSamplePrepBlocks * 8));
  l.pc = reinterpret_cast<int*>(take(kSamplePrepBlocks * 4));
  l.amax = take(2 * kArgmaxBlocks * 4);
  l.kk = reinterpret_cast<unsigned long long*>(take(8));
  l.out = reinterpret_cast<int32_t*>(take(4));
  if (ws) *ws = l;
  return off;
}

struct SampleKArgs {
  const float* logits;
  int V;
  const int32_t* hist;
  int nh;               // history ids (nh_dev: the capacity)
  const int32_t* nh_dev;  // null, or the device count of history ids (min with nh)
  float T, pen, top_p, min_p, u;
  int top_k;
  SampleWs ws;
};

// ---- per-token helpers (the host computes the same in sampler.cpp) -------------------------------
__device__ __forceinline__ float canon(float v) { return v != v ? -INFINITY : v; }
__device__ __forceinline__ unsigned long long skey(float s, int i) {
  uint32_t u = __float_as_uint(s == 0.f ? 0.f : s);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(i));
}
__device__ __forceinline__ int key_id(unsigned long long k) { return int(~static_cast<uint32_t>(k)); }
__device__ __forceinline__ double wfun(float s, float mx) { return s == mx ? 1.0 : exp(double(__fsub_rn(s, mx))); }

// Min (MAX = false) or max over the lanes in `peers` (a match_any group), the same on each of them.
template <bool MAX>
__device__ __forceinline__ uint32_t grp_reduce(unsigned peers, uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return MAX ? __reduce_max_sync(peers, v) : __reduce_min_sync(peers, v);
#else
  uint32_t r = v;
  for (unsigned p = peers; p; p &= p - 1) {
    const uint32_t o = __shfl_sync(peers, v, __ffs(p) - 1);
    r = MAX ? max(r, o) : min(r, o);
  }
  return r;
#endif
}
__device__ __forceinline__ uint32_t grp_min(unsigned peers, uint32_t v) { return grp_reduce<false>(peers, v); }
__device__ __forceinline__ uint32_t grp_max(unsigned peers, uint32_t v) { return grp_reduce<true>(peers, v); }
// Sum over the warp, the same value on every lane (lane 0's butterfly result): fixed order.
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return __shfl_sync(0xffffffffu, v, 0);
}
__device__ __forceinline__ double warp_incl_scan_d(double v) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double t = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += t;
  }
  return v;
}

// ---- single-block selection ---------------------------------------------------------------------
struct SelSmem {
  union {
    struct {
      uint32_t cnt[kSelWarps][kBuckets];
      double mass[kSelWarps][kBuckets];
    } h;
    struct {
      unsigned long long key[kGather], k2[kGather];
      double w[kGather], x[kGather], ex[kGather];
    } g;
  } u;
  double tmass[kBuckets];
  uint32_t tcnt[kBuckets];
  unsigned long long kmin[kBuckets], kmax[kBuckets];
  double stage[kSelWarps][32];
  double red[kSelWarps];
  float redf[kSelWarps], redf2[kSelWarps];
  int redi[kSelWarps];
  double total, f_mass, f_a, f_b;
  unsigned long long f_key;
  int n, imin, imax, f_status, f_b_sel, f_c, f_cnt, f_id;
  float f_mx, f_mn;
};

// Block-wide max s and min finite s over the prep kernel's partials -> sm.f_mx, sm.f_mn.
__device__ __forceinline__ void reduce_prep_partials(SelSmem& sm, const SampleWs& ws) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  float mx = t < kSamplePrepBlocks ? ws.pmax[t] : -INFINITY;
  float mn = t < kSamplePrepBlocks ? ws.pmin[t] : INFINITY;
  mx = warp_max(mx);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
  if (lane == 0) { sm.redf[warp] = mx; sm.redf2[warp] = mn; }
  __syncthreads();
  if (t == 0) {
    for (int w = 1; w < kSelWarps; ++w) { mx = fmaxf(mx, sm.redf[w]); mn = fminf(mn, sm.redf2[w]); }
    sm.f_mx = mx;
    sm.f_mn = mn;
  }
  __syncthreads();
}

// Exclusive scan of x[0, n) (n <= kGather) into ex; the total into sm.total. ex[j] + x[j] is the
// inclusive value everywhere it is used (one definition, so comparisons are consistent).
__device__ void block_scan(SelSmem& sm, const double* x, double* ex, int n) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int i0 = 2 * t, i1 = 2 * t + 1;
  const double a = i0 < n ? x[i0] : 0.0, b = i1 < n ? x[i1] : 0.0;
  const double inc = warp_incl_scan_d(a + b);
  double exl = __shfl_up_sync(0xffffffffu, inc, 1);
  if (lane == 0) exl = 0.0;
  if (lane == 31) sm.red[warp] = inc;
  __syncthreads();
  if (t == 0) {
    double acc = 0.0;
    for (int w = 0; w < kSelWarps; ++w) {
      const double v = sm.red[w];
      sm.red[w] = acc;
      acc += v;
    }
    sm.total = acc;
  }
  __syncthreads();
  const double e = sm.red[warp] + exl;
  if (i0 < n) ex[i0] = e;
  if (i1 < n) ex[i1] = e + a;
  __syncthreads();
}

// Bitonic sort of k[0, n) (n <= kGather), descending or ascending; pads to a power of two.
__device__ void block_sort(unsigned long long* k, int n, bool desc) {
  int n2 = 1;
  while (n2 < n) n2 <<= 1;
  for (int i = n + threadIdx.x; i < n2; i += kSelThreads) k[i] = desc ? 0ull : ~0ull;
  __syncthreads();
  for (int size = 2; size <= n2; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int t = threadIdx.x; t < n2 / 2; t += kSelThreads) {
        const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
        const bool up = ((lo & size) == 0) != desc;
        const unsigned long long x = k[lo], y = k[hi];
        if ((x > y) == up && x != y) { k[lo] = y; k[hi] = x; }
      }
      __syncthreads();
    }
}

// First index j < n with pred(j) (block-wide), or -1.
template <typename Pred>
__device__ __forceinline__ int block_first(SelSmem& sm, int n, Pred pred) {
  if (threadIdx.x == 0) sm.imin = INT_MAX;
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += kSelThreads)
    if (pred(j)) atomicMin(&sm.imin, j);
  __syncthreads();
  const int r = sm.imin;
  __syncthreads();
  return r == INT_MAX ? -1 : r;
}

// Gathers the keys of eligible tokens with lo <= key <= hi into sm.u.g.key, sorted descending;
// returns their number (the caller guarantees <= kGather).
template <bool kMass>
__device__ int gather_sorted(SelSmem& sm, const float* __restrict__ s, const double* __restrict__ w, int V,
                             unsigned long long lo, unsigned long long hi) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) sm.n = 0;
  __syncthreads();
  for (int base = warp * 32; base < V; base += kSelThreads) {
    const int i = base + lane;
    bool ok = false;
    unsigned long long key = 0;
    if (i < V) {
      key = skey(s[i], i);
      ok = key >= lo && key <= hi && (!kMass || w[i] > 0.0);
    }
    const unsigned bal = __ballot_sync(0xffffffffu, ok);
    int pos = 0;
    if (lane == 0 && bal) pos = atomicAdd(&sm.n, __popc(bal));
    pos = __shfl_sync(0xffffffffu, pos, 0);
    if (ok) {
      const int slot = pos + __popc(bal & ((1u << lane) - 1u));
      if (slot < kGather) sm.u.g.key[slot] = key;
    }
  }
  __syncthreads();
  const int n = min(sm.n, kGather);
  block_sort(sm.u.g.key, n, true);
  return n;
}

struct SelResult {
  unsigned long long K;  // threshold key: the kept tokens are those with key >= K
  int kept;              // how many eligible tokens have key >= K
  int n_list;            // > 0: sm.u.g.key[0, n_list) holds candidates sorted descending
  bool top;              // the list starts at the largest eligible key
};

// The first eligible token in descending key order whose inclusive cumulative weight reaches
// `target` (none: the last eligible token). Eligible: all tokens (weight 1, !kMass) or w > 0
// (weight w). gather_above: the final list holds every eligible token from the top (so it
// starts at the largest key), else only the tokens of the last bucket. total: eligible count.
template <bool kMass>
__device__ SelResult block_select(SelSmem& sm, const float* __restrict__ s, const double* __restrict__ w, int V,
                                  float mx, float mn, double target, bool gather_above, int total) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  unsigned long long klo = 0, khi = ~0ull;
  double above_m = 0.0;
  int above_c = 0, cur = total;
  float scale = (mx > mn && mx < INFINITY && mn > -INFINITY) ? float(kBuckets) / (mx - mn) : 0.f;
  if (!(scale < INFINITY)) scale = 0.f;
  for (bool first = true;; first = false) {
    if (gather_above ? above_c + cur <= kGather : cur <= kGather) {
      const int n = gather_sorted<kMass>(sm, s, w, V, klo, gather_above ? ~0ull : khi);
      if (n == 0) return {klo, above_c, 0, false};  // not expected: every pass has candidates
      for (int j = t; j < n; j += kSelThreads) sm.u.g.x[j] = kMass ? w[key_id(sm.u.g.key[j])] : 1.0;
      __syncthreads();
      block_scan(sm, sm.u.g.x, sm.u.g.ex, n);
      const double base_m = gather_above ? 0.0 : above_m;
      int j = block_first(sm, n, [&](int q) { return base_m + (sm.u.g.ex[q] + sm.u.g.x[q]) >= target; });
      if (j < 0) j = n - 1;
      return {sm.u.g.key[j], (gather_above ? 0 : above_c) + j + 1, n, gather_above || above_c == 0};
    }
    if (klo == khi) return {klo, above_c + 1, 0, false};
    int shift = 0;
    if (!first) {
      const unsigned long long span = khi - klo;
      shift = max(0, 64 - __clzll(static_cast<long long>(span)) - 8);
    }
    // histogram pass
    for (int b = lane; b < kBuckets; b += 32) {
      sm.u.h.cnt[warp][b] = 0;
      if (kMass) sm.u.h.mass[warp][b] = 0.0;
    }
    if (t < kBuckets) { sm.kmin[t] = ~0ull; sm.kmax[t] = 0ull; }
    __syncthreads();
    for (int base = warp * 32; base < V; base += kSelThreads) {
      const int i = base + lane;
      bool ok = false;
      unsigned long long key = 0;
      double wt = 1.0;
      uint32_t b = 0;
      if (i < V) {
        const float sv = s[i];
        key = skey(sv, i);
        ok = key >= klo && key <= khi;
        if (kMass && ok) {
          wt = w[i];
          ok = wt > 0.0;
        }
        if (ok) {
          if (first) {
            const float q = scale > 0.f ? __fmul_rn(__fsub_rn(mx, sv), scale) : 0.f;
            b = q >= float(kBuckets - 1) ? 0u : uint32_t(kBuckets - 1) - uint32_t(q);
          } else {
            b = uint32_t((key - klo) >> shift);
          }
        }
      }
      const unsigned peers = __match_any_sync(0xffffffffu, ok ? b : 0xffffffffu);
      if (kMass) {
        sm.stage[warp][lane] = wt;
        __syncwarp();
      }
      if (ok) {
        const uint32_t hi = uint32_t(key >> 32), lo = uint32_t(key);
        const uint32_t mnh = grp_min(peers, hi), mxh = grp_max(peers, hi);
        const uint32_t mnl = grp_min(peers, hi == mnh ? lo : 0xffffffffu);
        const uint32_t mxl = grp_max(peers, hi == mxh ? lo : 0u);
        if (lane == __ffs(peers) - 1) {
          sm.u.h.cnt[warp][b] += __popc(peers);
          if (kMass) {
            double m = 0.0;
            for (unsigned p = peers; p; p &= p - 1) m += sm.stage[warp][__ffs(p) - 1];
            sm.u.h.mass[warp][b] += m;
          }
          atomicMin(&sm.kmin[b], (static_cast<unsigned long long>(mnh) << 32) | mnl);
          atomicMax(&sm.kmax[b], (static_cast<unsigned long long>(mxh) << 32) | mxl);
        }
      }
      __syncwarp();  // the next leader of a bucket may be another lane
    }
    __syncthreads();
    if (t < kBuckets) {
      uint32_t c = 0;
      double m = 0.0;
      for (int q = 0; q < kSelWarps; ++q) {
        c += sm.u.h.cnt[q][t];
        if (kMass) m += sm.u.h.mass[q][t];
      }
      sm.tcnt[t] = c;
      sm.tmass[t] = kMass ? m : double(c);
    }
    __syncthreads();
    // warp 0 walks the buckets from the top: lane l holds buckets 255-8l .. 248-8l
    if (warp == 0) {
      double lm = 0.0;
      uint32_t lc = 0;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        lm += sm.tmass[kBuckets - 1 - 8 * lane - q];
        lc += sm.tcnt[kBuckets - 1 - 8 * lane - q];
      }
      const double im = warp_incl_scan_d(lm);
      uint32_t ic = lc;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint32_t v = __shfl_up_sync(0xffffffffu, ic, o);
        if (lane >= o) ic += v;
      }
      double em = __shfl_up_sync(0xffffffffu, im, 1);
      uint32_t ec = __shfl_up_sync(0xffffffffu, ic, 1);
      if (lane == 0) { em = 0.0; ec = 0; }
      double run = above_m + em;
      uint32_t runc = ec;
      int fq = -1, lowq = -1;
      double fprev = 0.0;
      uint32_t fc = 0;
      for (int q = 0; q < 8; ++q) {
        const int b = kBuckets - 1 - 8 * lane - q;
        const double prev = run;
        run += sm.tmass[b];
        if (sm.tcnt[b] > 0) {
          if (fq < 0 && run >= target) { fq = q; fprev = prev; fc = runc; }
          lowq = q;
        }
        runc += sm.tcnt[b];
      }
      const unsigned hit = __ballot_sync(0xffffffffu, fq >= 0);
      const unsigned ne = __ballot_sync(0xffffffffu, lowq >= 0);
      const uint32_t tot_c = __shfl_sync(0xffffffffu, ic, 31);
      if (hit) {
        if (lane == __ffs(hit) - 1) {
          sm.f_status = 1;
          sm.f_b_sel = kBuckets - 1 - 8 * lane - fq;
          sm.f_mass = fprev;
          sm.f_c = int(fc);
        }
      } else if (lane == (ne ? 31 - __clz(ne) : 0)) {
        sm.f_status = 2;  // the target is never reached: every eligible token is kept
        sm.f_b_sel = ne ? kBuckets - 1 - 8 * lane - lowq : -1;
        sm.f_c = int(tot_c);
      }
    }
    __syncthreads();
    const int status = sm.f_status, bsel = sm.f_b_sel;
    if (status == 2) return {bsel >= 0 ? sm.kmin[bsel] : klo, above_c + sm.f_c, 0, false};
    above_m = sm.f_mass;
    above_c += sm.f_c;
    cur = int(sm.tcnt[bsel]);
    klo = sm.kmin[bsel];
    khi = sm.kmax[bsel];
    __syncthreads();
  }
}

// The draw over the candidate list sm.u.g.key[0, n) (sorted descending, the most likely first):
// top-p (when apply_top_p: the list is the whole top-k set), min-p, then u over ascending ids.
__device__ void small_finish(SelSmem& sm, int n, float mx, bool apply_top_p, float top_p, float min_p, float u,
                             int32_t* out) {
  const int t = threadIdx.x;
  auto& g = sm.u.g;
  for (int j = t; j < n; j += kSelThreads) {
    const unsigned long long k = g.key[j];
    const uint32_t ob = uint32_t(k >> 32);
    const float sv = __uint_as_float((ob & 0x80000000u) ? (ob & 0x7fffffffu) : ~ob);
    g.w[j] = wfun(sv, mx);
  }
  if (t == 0) sm.f_id = key_id(g.key[0]);
  __syncthreads();
  int n_keep = n;
  if (apply_top_p) {
    block_scan(sm, g.w, g.ex, n);
    const double target = double(top_p) * sm.total;
    const int j = block_first(sm, n, [&](int q) { return g.ex[q] + g.w[q] >= target; });
    if (j >= 0) n_keep = j + 1;
  }
  if (t == 0) sm.n = 0;
  __syncthreads();
  for (int j = t; j < n; j += kSelThreads) {
    const bool kept = j < n_keep && g.w[j] > 0.0 && g.w[j] >= double(min_p);
    g.k2[j] = kept ? (static_cast<unsigned long long>(key_id(g.key[j])) << 32) | uint32_t(j) : ~0ull;
    if (kept) atomicAdd(&sm.n, 1);
  }
  __syncthreads();
  const int m = sm.n;
  block_sort(g.k2, n, false);
  for (int j = t; j < m; j += kSelThreads) g.x[j] = g.w[uint32_t(g.k2[j])];
  __syncthreads();
  block_scan(sm, g.x, g.ex, m);
  const double r = double(u) * sm.total;
  int j = block_first(sm, m, [&](int q) { return g.ex[q] + g.x[q] > r; });
  if (j < 0) j = m - 1;
  if (t == 0) *out = j >= 0 ? int32_t(g.k2[j] >> 32) : sm.f_id;
}

}  // namespace nf4flash::cuda
