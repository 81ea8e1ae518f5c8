// The in-order fused 4-bit decode GEMV with a lean inner loop (gemv_q4_seq's work order, epilogues
// and layout; what changed is what each tile costs in instructions and shared-memory wavefronts).
//
//   out_s[n, r] = epilogue( sum_k x[n, k] * code[q_s(r, k)] * absmax_s(r, k) + bias_s[r] ),  n < T <= 8
//
// Weights: tile16x64 (gemv_q4.cuh): row tile rt's KT column tiles of 512 bytes contiguous; absmax
// [RT][KT][16] (f32, or u8 codes + nested f32 absmax for double quant). x [T, cols] bf16/f16 is
// staged in shared memory (required: the launcher uses gemv_q4_seq when it does not fit).
// Epilogues (Store / Residual / SwiGLU) as gemv_q4_seq.cuh. With norm_w, x is first replaced by
// rms_norm(x) * norm_w in shared memory (256-thread configurations: rms_norm's exact arithmetic).
//
// Work: unit = one row tile of the concatenated segments (SwiGLU: the gate row tile, then the same
// up row tile, one "item" each); block b takes units b, b + G, ...; inside an item warp w takes
// column tiles w + W*i in batches of U (stride W), keeping D-1 batches of weights in flight in a
// register ring across item and unit boundaries.
// What the lean loop does differently (ncu on gemv_q4_seq, H200: 154 instructions and 28 shared
// wavefronts per 512-byte tile, 0.48 issued/cycle per scheduler):
//   - 32-bit running offsets per item (tile, absmax and nested index advance by constants per
//     batch; the U tiles of a batch are immediate offsets), no 64-bit index math per tile;
//   - no per-tile bounds tests when KT is a multiple of W*U (FULL); else a select per tile;
//   - nested absmax index = (row*cols + 64*kt) >> (log2 blocksize + log2 nested) in 32 bits;
//   - ASYNC: the item's cross-warp reduction without block barriers: each warp writes its
//     partial sums into one of two buffers and counts itself in; the last warp of the item sums
//     the W partials in warp order (deterministic) and runs the epilogue, then frees the buffer.
//     Measured slower than the barrier version (H200: 4096x14336 14.28 vs 13.74 us, decode @512
//     354.9 vs 387.3 tok/s); ncu shows no membar stalls, so the cause is not established (the
//     last warp of each item, which also does the whole epilogue, may become the straggler).
//     Kept as configurations a... for comparison.
// Per 512-byte tile the lean loop issues ~88 instructions (ncu, a8u4d3 gate+up) against 154 for
// gemv_q4_seq: 16 PRMT + 16 LDS for the table, 2 LDS.128 for x, 4 HMMA, the scale (LDS, FMUL,
// FADD, 2 SHFL, 4 FFMA), the next batch's 3 loads with their offsets, cursor and epilogue shares.
//
// Chained stages (NS > 1, the decode chain o -> gate/up -> down -> next layer's q/k/v): one
// persistent launch runs up to NS dependent GEMVs in order, each stage a Q4SeqArgs of its own (x of
// stage s is what stage s-1 wrote). The load cursor runs straight on into the next stage's weights
// (they depend on nothing), so a block's first batches of stage s are in flight while it waits
// for stage s-1; the compute cursor waits on a device-wide counter (every block adds 1 after its
// last item of a stage), then stages x from L2 (cp.async.cg) and folds the norm. All G blocks must be
// resident at once (the launcher sizes G by the occupancy calculator; a wait that never ends
// traps instead of hanging). The last block to leave re-zeroes the counters for the next launch.
//
// Stream-K (kLeanSK, opt-in NF4FLASH_GEMV_SK=1; NS = 1, whole batches): instead of whole units
// round-robin, block b takes the contiguous batches [b*B/G, (b+1)*B/G) of the launch's B = units x
// nsub x NB batches (every block resident, each range >= one unit). A unit cut by a range boundary
// is split between two neighbours: the later block (holding the unit's end, at the start of its
// range) publishes its per-sub sums as tagged 64-bit values in its slot; the earlier one (holding
// the unit's start, at the end of its range) adds them after its own (K order: deterministic),
// runs the epilogue and clears the tags. Measured slower (fourteenth session): opt-in.
// Grouped tiles (kLeanGrouped; kernel-bench's layout experiment, Q4Device::tile_group = W*U): the
// weight's batch k of row tile rt sits at tiles (k * RT + rt) * W*U, so the blocks on neighbouring
// units read neighbouring bytes at the same time (one window moving through the weight instead of
// one stream per block); the same tiles in the same order per warp, so the outputs are bit for bit
// the tile16x64 layout's. Only the start and step of lw and la (absmax records grouped alike)
// differ; the nested absmax index is the logical one as always.
// Ablations (kLeanAbl*; kernel-bench's speed-of-light rows, CudaBackendOptions::gemv_ablate): the
// T = 1 form of h8u4d3 with one cost taken out at a time -- the code table (fill and lookups), the
// absmax path (loads, decode, shuffles, scale FMAs), the per-tile x loads, the byte permutes --
// and everything else as it is, so the time each removes bounds what any cheaper form of that cost can win. The
// outputs are wrong by design; nothing but kernel-bench can select them.
// ptxas (sm_90, 128 registers): h8u4d3's T=1 forms and the chain spill nothing; the stream-K dq
// form 24 bytes, l8u4d3 dq 8, h8u4d3's T>1 single-quant form 60-108 (fourteenth session).
#pragma once
#include "backend/cuda/kernels/elementwise.cuh"
#include "backend/cuda/kernels/gemv_q4_seq.cuh"
#include "backend/cuda/kernels/norm_prologue.cuh"

namespace nf4flash::cuda {

constexpr int kChainMaxStages = 4;
// The lean kernel's arguments: NS = 1 a single GEMV; NS > 1 up to NS chained stages that share T,
// the code tables and the absmax block sizes (the host checks) and whose KT are multiples of W*U.
template <int NS>
struct Q4LeanArgs {
  Q4SeqArgs st[NS];
  int nst = 1;
  unsigned* cnt = nullptr;  // NS > 1: kChainMaxStages + 1 counters, zero before and after a launch
};

// The chain's device-wide stage counters: publish this block's stores of stage s (a release
// reduction after the block's barrier) / wait until every block of the grid has published stage s
// (an acquire poll by one thread, then the block's barrier orders the others' later loads).
__device__ __forceinline__ void chain_signal(unsigned* cnt, int s) {
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(cnt + s) : "memory");
}
__device__ __forceinline__ void chain_wait(unsigned* cnt, int s, unsigned G) {
  if (threadIdx.x == 0) {
    unsigned v = 0;
    for (uint32_t spin = 0;; ++spin) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(cnt + s) : "memory");
      if (v >= G) break;
      if (spin > (1u << 22)) __trap();  // >= 2 s (an L2 round trip a spin): blocks not all resident
    }
  }
  __syncthreads();
}

// A chained stage's x prologue (norm_prologue.cuh; x written by the earlier stage, read via L2) out of line:
// the inner loop is inlined three times around one call instead of around three copies of it.
template <typename TA>
__device__ __noinline__ void lean_prepare_x_chain(const Q4SeqArgs* a, uint8_t* xs, float (*s_part)[8]) {
  stage_rms_norm_x<TA>(a->x, a->T, a->cols, a->x_stride, a->norm_w, a->norm_eps, xs, s_part);
}

// Variant bits of the lean kernel (configuration letters in ops_gemv_lean.cu).
enum LeanFlags : int {
  kLeanAsync = 1,  // barrier-free cross-warp reduction (a...)
  kLeanXPred = 2,  // x fragments loaded only by the lanes whose mma column is a real token (p..., h...)
  kLeanHalf = 4,   // lanes 0-15 load and decode the absmax of a batch's even tiles, 16-31 of its odd
                   // ones: one scale load and decode per two tiles, half the scale registers (h...)
  kLeanAlu1 = 8,   // bits 8/16: the first 1, 2 or 3 of each tile's 4 code words decoded with byte
  kLeanAlu2 = 16,  // permutes from register tables instead of shared-memory lookups (q4_word_alu,
  kLeanAlu4 = 32,  // gemv_q4.cuh); Alu4: all four
  kLeanT1 = 64,    // T = 1 only (the launcher adds it): token column 1's accumulators left alone
  kLeanSK = 128,   // stream-K ranges ("Stream-K" above; the launcher adds it when opted in)
  kLeanGrouped = 256,  // the grouped tile layout (Q4Device::tile_group == W*U; kernel-bench only):
                       // batch k of row tile rt at tiles (k * RT + rt) * W*U, its absmax alike
  // Speed-of-light ablations (kernel-bench only, CudaBackendOptions::gemv_ablate; WRONG RESULTS by
  // design, for timing): each removes one cost of h8u4d3's T = 1 form and keeps everything else
  // (grid, loads, ring, items, barriers, epilogue, mma count)
  kLeanAblLut = 512,     // no code table: no fill in the prologue, and the byte_perm'd table address
                         // goes into the mma as the fragment instead of the entry loaded from it
  kLeanAblScale = 1024,  // no absmax: no scale loads, decode, shuffles or scale FMAs (mma into acc)
  kLeanAblX = 2048,      // x fragments read from shared memory once per launch, not per tile
  kLeanAblPrmt = 4096,   // with kLeanAblLut: no byte permutes either (the code words themselves are
                         // the fragments: no decode instruction at all)
};
constexpr int kLeanAblMask = kLeanAblLut | kLeanAblScale | kLeanAblX | kLeanAblPrmt;

// Stream-K slot protocol (kLeanSK): a 64-bit (tag << 32 | f32 bits) store or load is single-copy
// atomic, so a tagged value needs no fence: the writer stores (1, v), the reader polls until the tag
// is 1 and stores 0 back for the next launch (kernel boundaries order the launches).
__device__ __forceinline__ void sk_put(unsigned long long* p, float v) {
  const unsigned long long x = (1ull << 32) | __float_as_uint(v);
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(x) : "memory");
}
__device__ __forceinline__ float sk_take(unsigned long long* p) {
  unsigned long long x = 0;
  for (uint32_t spin = 0;; ++spin) {
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(x) : "l"(p) : "memory");
    if ((x >> 32) == 1) break;
    if (spin > (1u << 22)) __trap();  // the neighbour block never published: not all resident
  }
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(0ull) : "memory");
  return __uint_as_float(uint32_t(x));
}

template <typename TA, bool DQ, bool FULL, int FLAGS, int W, int U, int D, int MINB, int NS = 1>
__global__ void __launch_bounds__(W * 32, MINB) gemv_q4_lean_kernel(const __grid_constant__ Q4LeanArgs<NS> c) {
  constexpr bool CHAIN = NS > 1;
  constexpr bool ASYNC = FLAGS & kLeanAsync, XPRED = FLAGS & kLeanXPred;
  static_assert(!CHAIN || (!ASYNC && FULL), "chained stages: barrier reduction, whole batches");
  constexpr bool HALF = FLAGS & kLeanHalf, T1 = FLAGS & kLeanT1, SK = FLAGS & kLeanSK, GROUPED = FLAGS & kLeanGrouped;
  static_assert(!SK || (NS == 1 && FULL && !ASYNC), "stream-K: one GEMV, whole batches, barrier reduction");
  static_assert(!GROUPED || (NS == 1 && FULL && !SK), "grouped tiles: one GEMV, whole batches, units round robin");
  constexpr bool ABL_LUT = FLAGS & kLeanAblLut, ABL_SCALE = FLAGS & kLeanAblScale, ABL_X = FLAGS & kLeanAblX;
  constexpr bool ABL_PRMT = FLAGS & kLeanAblPrmt;
  static_assert(!ABL_PRMT || ABL_LUT, "ablations: no byte permutes only without the table");
  static_assert(!(FLAGS & kLeanAblMask) || (NS == 1 && FULL && HALF && T1 && !SK && !GROUPED && !(FLAGS & kLeanAlu4) &&
                                           !(FLAGS & (kLeanAlu1 | kLeanAlu2))),
                "ablations: h8u4d3's T = 1 form only");
  constexpr int NALU = (FLAGS & kLeanAlu4) ? 4 : (FLAGS / kLeanAlu1) & 3;
  static_assert(!HALF || U % 2 == 0, "kLeanHalf pairs the tiles of a batch");
  constexpr int US = HALF ? U / 2 : U;  // scale loads per lane and batch
  extern __shared__ __align__(16) uint32_t lut[];  // [256][64], then x [T][x_stride bytes]
  __shared__ float red[2][W][16][8];  // two buffers: one barrier per item (item & 1), or ASYNC's two
  __shared__ float gate_v[128];
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];
  __shared__ int s_cnt[2], s_ready[2];
  __shared__ float s_part[kGemvMaxRows][8];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3, r = lane & 15;
  const uint32_t lut_s = static_cast<uint32_t>(__cvta_generic_to_shared(lut));
  const uint32_t lane_b = 4u * lane;
  const int G = gridDim.x;
  constexpr int WU = W * U;
  // stage s's arguments (NS = 1: the one GEMV); T, the code tables and nsh are stage 0's
  auto A = [&](int s) -> const Q4SeqArgs& { return c.st[CHAIN ? s : 0]; };
  const Q4SeqArgs& a0 = c.st[0];
  const int nsh = a0.log2_blocksize + a0.log2_nested;

  // load cursor: (stage, unit, sub, batch), its stage's sizes, and the running offsets of the item
  int ls = 0, lu = blockIdx.x, lsub = 0, lb = 0;
  // the sizes of stage s: stage 0's in registers; CHAIN: read from the parameters where used
  // (registers held per stage spilled in the inner loop)
  const int KT0 = int(a0.KT), NB0 = (KT0 + WU - 1) / WU, units0 = int(a0.units);  // NB: batches per item
  // SK: this block's batches [sk_s, sk_e) of the launch's units x nsub x NB0, in order; the unit
  // holding sk_s (when not its first batch) is finished by the block before, the one holding sk_e
  // by this block (the slot protocol above); lrem / crem: batches left to load / to compute
  const uint32_t sk_unit = uint32_t(a0.nsub * NB0), sk_tot = uint32_t(units0) * sk_unit;
  const uint32_t sk_s = SK ? uint32_t(uint64_t(blockIdx.x) * sk_tot / G) : 0u;
  const uint32_t sk_e = SK ? uint32_t(uint64_t(blockIdx.x + 1) * sk_tot / G) : 0u;
  const int sk_us = int(sk_s / sk_unit), sk_ue = int(sk_e / sk_unit);  // head / tail unit
  const bool sk_head = SK && sk_s % sk_unit != 0, sk_tail = SK && sk_e % sk_unit != 0;
  const int sk_sub0 = SK ? int(sk_s % sk_unit) / NB0 : 0, sk_b0 = SK ? int(sk_s % sk_unit) % NB0 : 0;
  int lrem = int(sk_e - sk_s);
  if constexpr (SK) lu = sk_us, lsub = sk_sub0, lb = sk_b0;
  auto KT_of = [&](int s) { return CHAIN ? int(A(s).KT) : KT0; };
  auto NB_of = [&](int s) { return CHAIN ? int(A(s).KT) / WU : NB0; };
  auto units_of = [&](int s) { return CHAIN ? int(A(s).units) : units0; };
  const uint4* lw = nullptr;  // this lane's 16 bytes of the warp's first tile of the batch
  const uint8_t* la = nullptr;  // absmax of row r (u8 or f32), same tile
  const float* lnest = nullptr;
  uint32_t lo = 0;  // DQ: row * cols + 64 * kt of the batch's first tile
  [[maybe_unused]] uint32_t lstep = uint32_t(WU) * 32;  // lw's step per batch (GROUPED: a whole group of row tiles)
  auto lvalid = [&]() { return CHAIN ? ls < c.nst : SK ? lrem > 0 : lu < units0; };
  // CHAIN: move the cursor on to the first stage (from ls) that gives this block a unit
  auto lsettle = [&]() {
    if constexpr (CHAIN) {
      while (ls < c.nst && lu >= units_of(ls)) {
        if (++ls == c.nst) break;
        lu = blockIdx.x;
      }
    }
  };
  auto start_item = [&]() {
    int rt;
    const Q4SeqArgs& a = A(ls);
    const Q4StreamSeg& sg = a.seg[q4_seq_segment(a, lu, lsub, rt)];
    const uint32_t kt0 = uint32_t(warp) + (SK ? uint32_t(lb * WU) : 0u);  // SK: may start mid-item
    const uint32_t tile0 = uint32_t(rt) * uint32_t(KT_of(ls)) + kt0;
    const size_t gtile0 = GROUPED ? size_t(rt) * WU + kt0 : size_t(tile0);  // GROUPED: in group 0
    if constexpr (GROUPED) lstep = uint32_t(sg.RT) * uint32_t(WU) * 32;
    lw = reinterpret_cast<const uint4*>(sg.tiles) + gtile0 * 32 + lane;
    la = static_cast<const uint8_t*>(sg.absmax) + (gtile0 * 16 + r) * (DQ ? 1 : 4);
    lnest = sg.nested_absmax;
    int row = rt * 16 + r;
    row = row < int(sg.rows) ? row : int(sg.rows) - 1;
    lo = uint32_t(row) * uint32_t(a.cols) + 64u * kt0;
  };
  auto step_batch = [&]() {  // the load cursor to the item's next batch
    if constexpr (GROUPED) {  // the next group: RT row tiles on
      lw += lstep;
      la += (lstep >> 1) * (DQ ? 1 : 4);
    } else {
      lw += WU * 32;
      la += WU * 16 * (DQ ? 1 : 4);
    }
    lo += 64u * WU;
  };
  auto advance_load = [&]() {
    if constexpr (CHAIN) {
      if (!lvalid()) return;
    }
    if constexpr (SK) {
      if (lrem <= 0 || --lrem == 0) return;
      if (++lb == NB0) {
        lb = 0;
        if (++lsub == a0.nsub) lsub = 0, ++lu;
        start_item();
      } else {
        step_batch();
      }
      return;
    }
    if (++lb == NB_of(ls)) {
      lb = 0;
      if (++lsub == A(ls).nsub) {
        lsub = 0;
        lu += G;
        lsettle();
      }
      if (lvalid()) start_item();
    } else {
      step_batch();
    }
  };
  // HALF: this lane's tile within each pair of the batch (its absmax offsets)
  const int hsel = HALF ? lane >> 4 : 0;
  const uint32_t h_abs = uint32_t(hsel * W * 16 * (DQ ? 1 : 4)), h_lo = uint32_t(64 * hsel * W);
  // the batch at the load cursor into ring slot (wq, s): s.x = u8 code (DQ) or f32 absmax, s.y = nested absmax
  auto load = [&](uint4* wq, float2* s) {
#pragma unroll
    for (int uu = 0; uu < U; ++uu) {
      bool ok = true;
      if constexpr (!FULL) ok = lb * WU + uu * W + warp < KT0;
      wq[uu] = ok ? ld_stream_u4(lw + uu * W * 32) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int p = 0; p < US; ++p) {
      const int tu = HALF ? 2 * p : p;  // + hsel: the lane's tile
      bool ok = true;
      if constexpr (!FULL) ok = lb * WU + (tu + hsel) * W + warp < KT0;
      if constexpr (ABL_SCALE) ok = false;  // ablation: no absmax loads
      if (ok) {
        const uint8_t* ap = la + h_abs;
        if constexpr (DQ) {
          s[p] = make_float2(__int_as_float(__ldg(ap + tu * W * 16)),
                             __ldg(lnest + ((lo + h_lo + 64u * tu * W) >> nsh)));
        } else {
          s[p] = make_float2(__ldg(reinterpret_cast<const float*>(ap) + tu * W * 16), 0.f);
        }
      } else {
        s[p] = make_float2(0.f, 0.f);  // scale 0: the tile adds nothing
      }
    }
  };

  pdl_trigger();
  if constexpr (!CHAIN && !SK) {
    if (int(blockIdx.x) >= units0) return;
  }
  // Loads of what no previous kernel writes and the prologue waits for go out first, before the
  // weight stream they would otherwise queue behind (ncu, p8u4d3 q/k/v at T=1: the nested code
  // table's load was 16% of the launch's stall samples, the norm weights' another 6%): the nested
  // code table into registers, the norm weights into L1 (prefetch).
  constexpr int NCT = (256 + W * 32 - 1) / (W * 32);
  float ncode[NCT];
  if constexpr (DQ) {
#pragma unroll
    for (int j = 0; j < NCT; ++j)
      if (tid + j * W * 32 < 256) ncode[j] = __ldg(a0.nested_code + tid + j * W * 32);
  }
  if (a0.norm_w) {
    for (int i = tid; i < int(a0.cols) / 32; i += W * 32)  // 128-byte lines of the f32 weights
      asm volatile("prefetch.global.L1 [%0];" ::"l"(a0.norm_w + 32 * i));
  }
  uint4 wb[D][U];
  float2 sb[D][US];
  lsettle();
  if (lvalid()) start_item();
  // the first D-1 batches' weights (they may overlap the previous kernel, PDL), then the tables
  // while they are in flight, then x (written by the previous kernel)
#pragma unroll
  for (int d = 0; d < D - 1; ++d) {
    if (lvalid()) load(wb[d], sb[d]);
    advance_load();
  }
  if (tid < 16) s_bits[tid] = bits16<TA>(a0.code[tid]);
  if (tid < 2) {
    s_cnt[tid] = 0;
    s_ready[tid] = 0;
  }
  __syncthreads();
  if constexpr (!ABL_LUT) q4_fill_lut<64, W * 32>(lut, s_bits);
  uint32_t tl[4] = {0, 0, 0, 0}, th[4] = {0, 0, 0, 0};  // NALU: the codes' low / high bytes
  if constexpr (NALU > 0) {
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const uint32_t b = s_bits[c];
      tl[c >> 2] |= (b & 0xffu) << (8 * (c & 3));
      th[c >> 2] |= ((b >> 8) & 0xffu) << (8 * (c & 3));
    }
  }
  if constexpr (DQ) {  // read after the barrier that follows the x staging
#pragma unroll
    for (int j = 0; j < NCT; ++j)
      if (tid + j * W * 32 < 256) s_nested_code[tid + j * W * 32] = ncode[j];
  }
  pdl_wait();
  uint8_t* xs = reinterpret_cast<uint8_t*>(lut) + q4_lut_bytes(2);
  // this lane's x: token min(g, T-1), columns 64 kt + 16 t .. +15 (lanes g >= T compute columns
  // that are never stored). XPRED: only lanes g < T load (1-2 shared wavefronts per 16-byte load
  // instead of 4; ncu on l8u4d3: ~9 of 29 wavefronts per tile were x); the others keep the last
  // (finite) values, which only reach the never-stored columns. One fragment pair for all tiles.
  const uint8_t* xs_l = xs;
  const bool x_load = !XPRED || g < a0.T;
  uint4 xa = make_uint4(0, 0, 0, 0), xb = make_uint4(0, 0, 0, 0);

  // compute cursor: (stage, unit, sub, batch), the item's segment and row tile
  int cs = 0, cu = blockIdx.x, csub = 0, cb = 0, crt = 0, ck = 0;
  float offset = 0.f;
  // start stage cs (CHAIN: the first from cs that gives this block a unit, counting itself done
  // with the ones skipped; false when none is left): wait for the previous stage, stage x
  auto enter_stage = [&]() -> bool {
    if constexpr (CHAIN) {
      while (cs < c.nst && int(blockIdx.x) >= int(A(cs).units)) chain_signal(c.cnt, cs++);
      if (cs == c.nst) return false;
      if (cs > 0) chain_wait(c.cnt, cs - 1, unsigned(G));
    }
    const Q4SeqArgs& a = A(cs);
    static_assert(!CHAIN || W == 8, "chained stages fold norms: 256-thread blocks");
    bool staged = false;
    if constexpr (CHAIN) {
      if (cs > 0) lean_prepare_x_chain<TA>(&a, xs, s_part), staged = true;
    }
    // x, with the norm folded (the host fuses norms only into 256-thread configurations)
    if (!staged) stage_rms_norm_x<TA>(a.x, a.T, a.cols, a.x_stride, a.norm_w, a.norm_eps, xs, s_part);
    xs_l = xs + min(g, a.T - 1) * a.x_stride + 32 * t + 128 * warp;
    cu = blockIdx.x, csub = 0, cb = 0;
    if constexpr (SK) cu = sk_us, csub = sk_sub0, cb = sk_b0;
    ck = q4_seq_segment(a, cu, csub, crt);
    offset = a.seg[ck].offset;
    return true;
  };
  bool more = enter_stage();
  if constexpr (ABL_X) {  // ablation: one fragment pair for the whole launch
    if (more && x_load) {
      xa = reinterpret_cast<const uint4*>(xs_l)[0];
      xb = reinterpret_cast<const uint4*>(xs_l)[1];
    }
  }
  int item = 0;  // items finished by this block (ASYNC: buffer item & 1, its use item >> 1)
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int crem = int(sk_e - sk_s);     // SK: batches left to compute
  float own0 = 0.f, own1 = 0.f;    // SK, threads < 128: this block's sums of a split unit, per sub

  // SK: the end of an item at the compute cursor (last: this block's last batch; done: the unit's
  // last batch). Items of units inside the range end as always; a split unit's sums go to own[sub]:
  // the head unit's are published when it is done, the tail unit's are added (own first, in K
  // order) to what the next block published for it, then the epilogue runs here.
  auto finish_item_sk = [&](bool last, bool done) {
    seq_item_publish<W>(red[item & 1], acc);
    if (tid < 128) {
      const float y = seq_item_y<W>(red[item & 1], tid);
      const bool head = sk_head && cu == sk_us, tail = sk_tail && cu == sk_ue;
      if (!head && !tail) {
        seq_item_out<TA>(a0, ck, crt, csub, tid, y, gate_v);
      } else {
        if (csub == 0) own0 = y;
        else own1 = y;
        unsigned long long* slot = a0.sk_slots + size_t(blockIdx.x + (head ? 0 : 1)) * 256 + tid;
        if (head && done) {
          sk_put(slot, own0);
          if (a0.nsub == 2) sk_put(slot + 128, own1);
          own0 = own1 = 0.f;
        }
        if (tail && last) {
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            if (s == a0.nsub) break;
            const float y_s = (s ? own1 : own0) + sk_take(slot + 128 * s);
            int rt_s;
            const int k_s = q4_seq_segment(a0, cu, s, rt_s);
            seq_item_out<TA>(a0, k_s, rt_s, s, tid, y_s, gate_v);
          }
        }
      }
    }
    ++item;
  };

  auto finish_item = [&]() {
    if constexpr (!ASYNC) {
      seq_item_epilogue<TA, W, false>(A(cs), red[item & 1], gate_v, acc, ck, crt, csub);
    } else {
      const Q4SeqArgs& a = a0;
      const int buf = item & 1, use = item >> 1;
      // the buffer's previous use must have been summed (its last warp frees it)
      while (*reinterpret_cast<volatile int*>(&s_ready[buf]) < use) {
      }
      float(&rb)[W][16][8] = red[buf];
      rb[warp][g][2 * t] = acc[0];
      rb[warp][g][2 * t + 1] = acc[1];
      rb[warp][g + 8][2 * t] = acc[2];
      rb[warp][g + 8][2 * t + 1] = acc[3];
      __threadfence_block();
      __syncwarp();
      int prev = 0;
      if (lane == 0) prev = atomicAdd(&s_cnt[buf], 1);
      prev = __shfl_sync(0xffffffffu, prev, 0);
      if (prev == W - 1) {  // the last warp of this item: sum in warp order, epilogue, free
        __threadfence_block();
#pragma unroll
        for (int q = 0; q < 4; ++q) {  // outputs o = lane + 32q, as threads o of seq_item_out
          const int o = lane + 32 * q;
          float y = 0.f;
#pragma unroll
          for (int w = 0; w < W; ++w) y += reinterpret_cast<volatile float*>(&rb[w][o >> 3][o & 7])[0];
          seq_item_out<TA>(a, ck, crt, csub, o, y, gate_v);
        }
        __threadfence_block();
        __syncwarp();
        if (lane == 0) {
          s_cnt[buf] = 0;
          __threadfence_block();
          *reinterpret_cast<volatile int*>(&s_ready[buf]) = use + 1;
        }
      }
    }
    ++item;
  };

  while (more) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      // keep D-1 batches in flight: load into the slot the previous step consumed
      if (lvalid()) load(wb[(d + D - 1) % D], sb[(d + D - 1) % D]);
      advance_load();
      const uint8_t* xb_addr = xs_l + cb * (WU * 128);
      float sv_pair = 0.f;  // HALF
#pragma unroll
      for (int uu = 0; uu < U; ++uu) {
        bool ok = true;
        if constexpr (!FULL) ok = cb * WU + uu * W + warp < int(a0.KT);
        if (ok) {  // warp-uniform
          if (x_load && !ABL_X) {
            const uint4* xp = reinterpret_cast<const uint4*>(xb_addr + uu * W * 128);
            xa = xp[0];
            xb = xp[1];
          }
          if constexpr (HALF) {
            // the pair's absmax, decoded once at its even tile: lanes 0-15 hold the even tile's
            // rows, 16-31 the odd one's (an odd tile is valid only where its even one is)
            if (!ABL_SCALE && (uu & 1) == 0) sv_pair = q4_scale_decode<DQ>(sb[d][uu / 2], offset, s_nested_code);
            const int src = g + 16 * (uu & 1);
            q4_tile_apply<TA, 0, T1, ABL_PRMT ? 2 : ABL_LUT ? 1 : 0, ABL_SCALE>(lut_s, lane_b, wb[d][uu], xa, xb,
                                                                               sv_pair, src, src + 8, acc);
          } else {
            q4_tile_scaled<TA, DQ, NALU, T1>(lut_s, lane_b, wb[d][uu], xa, xb, sb[d][uu], offset, s_nested_code, g,
                                             acc, tl, th);
          }
        }
      }
      if constexpr (SK) {
        const bool last = --crem == 0, item_end = ++cb == NB0;
        if (item_end || last) {
          finish_item_sk(last, item_end && csub == a0.nsub - 1);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[i] = 0.f;
          if (last) {
            more = false;
            break;
          }
          cb = 0;
          if (++csub == a0.nsub) csub = 0, ++cu;
          ck = q4_seq_segment(a0, cu, csub, crt);
          offset = a0.seg[ck].offset;
        }
        continue;
      }
      if (++cb == NB_of(cs)) {
        finish_item();
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = 0.f;
        cb = 0;
        if (++csub == A(cs).nsub) {
          csub = 0;
          cu += G;
        }
        if (cu >= units_of(cs)) {  // block-uniform: this block's share of the stage is done
          if constexpr (CHAIN) {
            chain_signal(c.cnt, cs++);
            more = enter_stage();
          } else {
            more = false;
          }
          if (!more) break;
        } else {
          ck = q4_seq_segment(A(cs), cu, csub, crt);
          offset = A(cs).seg[ck].offset;
        }
      }
    }
  }
  if constexpr (CHAIN) {
    // when the last block counts itself out, every block is past every wait: it re-zeroes the
    // counters for the next launch
    if (tid == 0) {
      __threadfence();
      if (atomicAdd(c.cnt + kChainMaxStages, 1u) == unsigned(G) - 1) {
        __threadfence();
        for (int i = 0; i <= kChainMaxStages; ++i) atomicExch(c.cnt + i, 0u);
      }
    }
  }
}

}  // namespace nf4flash::cuda
