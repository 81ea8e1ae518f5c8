// The skinny 4-bit GEMM: the batched decode step's linears, 9..64 rows of x against 4-bit weights
// (mma.sync and cp.async, any sm_80+ GPU).
//
//   out_s[n, r] = sum_k x[n, k] * code[q_s(r, k)] * absmax_s(r, k) + bias_s[r],   n < T <= 64
//
// Same layout and arithmetic as the decode GEMV (gemv_q4_decode.cuh): weights in the tile16x64
// layout of gemv_q4.cuh (512 bytes of codes per 16 rows x 64 columns, absmax [RT][KT][16] f32 or
// u8 codes + nested f32 absmax for double quant), codes rounded to 16 bits through the per-lane
// byte table, each tile's mma partial sum scaled by its row's absmax in f32. x: [T, cols] bf16/f16;
// out_s: [T, rows_s] compute dtype or f32. Up to three weights sharing x in one launch (q, k, v;
// gate and up), each with its own output.
//
// Work: a "unit" is W x R = 16 consecutive row tiles of one weight (warp w owns row tiles w*R ..
// w*R+R-1 of it), a "step" one 64-column tile of a unit. The units x KT steps of the launch are
// cut into gridDim.x equal contiguous ranges (stream-K): block b takes steps [b*N/G, (b+1)*N/G),
// crossing unit boundaries, so every block does the same work whatever the shapes.
// A step's operands go through an S-stage shared-memory ring filled by cp.async S-1 steps ahead:
// the unit's 16 code tiles (8 KiB, as laid out in global memory), their absmax (64 bytes per tile)
// and x's 64 columns of the T tokens (rows of 144 bytes: conflict-free 16-byte fragment loads).
// The first S-1 steps' weights are requested before the PDL wait, their x after it.
// One barrier per step; one block of 8 warps per SM (up to 255 registers), 6 stages. Each block
// takes at least kSkinnyMinSteps steps (fewer blocks than SMs on small launches) so that a unit is
// cut into few parts. Per step a warp decodes its R tiles once (code word 0 through the register
// table, q4_word_prmt; words 1-3 by 12 shared-table lookups) and multiplies each against
// NT = ceil(T/8) token tiles (R * NT * 4 mma.m16n8k16); with NT = 8 the token tiles go in two
// halves of 4 (x fragments reloaded from shared memory per tile).
//
// The wgmma form (WG, sm_90a, 17..32 rows: NT = 4): the same units, steps, absmax and per-tile f32
// scaling; the mma products become one warpgroup MMA per row tile and K step (wgmma m64n32k16,
// A = the decoded code words in registers, warps 0-3 / 4-7 each giving 16 of the 64 rows; B = x
// from shared memory): x's 64 columns of 32 tokens (zero past T) are staged in wgmma's
// 128-byte-swizzled K-major layout with the columns permuted as the tile layout permutes the A
// fragment's K slots (4-byte unit 8j + 4h + t of a token's row holds x's 4-byte unit 8t + 2j + h:
// column pair c of a row goes to chunk c % 8 ^ token % 8 of the row, slot c / 8), gathered by
// 4-byte cp.async. Each step's wgmmas start from zero (scale-d 0); the warp waits for them and
// scales them by the absmax into the f32 accumulators (keeping a step's wgmmas in flight while the
// next step decodes measured 16% slower: H100, 14336x4096 at 32 rows, 32.8 against 28.2 us).
//
// A unit whose steps fall in one block's range is stored by that block. A unit cut between blocks
// first..last: each block stores its f32 accumulators to slot (unit + block) of the workspace (in
// register order: value i of thread tid at i * 256 + tid), then takes a ticket on the unit's
// counter; the last of them sums slots first..last in that order (the same sum whichever block
// comes last: deterministic), stores the unit and resets the counter to zero.
#pragma once
#include "backend/cuda/kernels/cp_async.cuh"
#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"
#include "backend/cuda/kernels/wgmma.cuh"

namespace nf4flash::cuda {

constexpr int kSkinnyW = 8;  // warps per block
constexpr int kSkinnyMaxSegs = 3;

struct Q4SkinnySeg {
  const uint8_t* tiles;
  const void* absmax;          // f32 [RT][KT][16], or u8 codes (double quant)
  const float* nested_absmax;  // double quant
  float offset;                // double quant
  const float* bias;           // [rows] or null
  void* out;                   // [T, rows]
  int64_t rows;
  int RT;
};

struct Q4SkinnyArgs {
  Q4SkinnySeg seg[kSkinnyMaxSegs];
  int unit_end[kSkinnyMaxSegs];  // cumulative units of segments 0..k
  float code[16];
  const float* nested_code;
  const void* x;  // [T, cols]
  int64_t cols;
  int KT, units, nseg, T, out_f32;
  int log2_blocksize, log2_nested;
  float* partial;  // (units + gridDim.x) slots of kSkinnyW * 32 * R * NT * 4 floats
  int* tickets;    // [units], zero between launches
};

// Shared-memory stage of one step: codes [W*R tiles][512], absmax [W*R tiles][64] (16 f32, or 16
// u8 codes), x [NT*8 tokens][kSkinnyXRow] (columns 64 kt .. +63 of tokens < T).
constexpr int kSkinnyR = 2;
constexpr int kSkinnyMinSteps = 8;
constexpr int kSkinnyXRow = 144;
// The wgmma form's stage: x [32 tokens][128 bytes] (swizzled, 1024-byte aligned), then codes and
// absmax as above; the dynamic shared memory gets 1024 bytes of slack for the alignment.
constexpr int kSkinnyWgTokens = 32;
__host__ __device__ constexpr int skinny_stage_bytes(int nt, bool wg = false) {
  return kSkinnyW * kSkinnyR * (512 + 64) + (wg ? kSkinnyWgTokens * 128 : nt * 8 * kSkinnyXRow);
}
__host__ __device__ constexpr int skinny_smem_bytes(int nt, int stages, bool wg = false) {
  return (wg ? 1024 : 0) + kQ4LutBytes + stages * skinny_stage_bytes(nt, wg);
}

// The block that owns step p of N steps cut into G ranges: the largest b with b*N/G <= p.
__device__ __forceinline__ int skinny_owner(int64_t p, int64_t N, int G) { return int(((p + 1) * G - 1) / N); }

// One row tile's step against NTH token tiles: the 4 mma of each token tile (A = the tile's code
// words fa[j], B = the x fragment of step j: bytes 32 t + 4 j .. + 3 of the token's 64 columns,
// read from the x stage at xs + row offsets xo), the partial sums of rows g, g + 8 scaled by their
// absmax s0, s8 and added to acc (rows g, g + 8 x tokens 2t, 2t + 1 of each token tile).
template <typename TA, int NTH>
__device__ __forceinline__ void skinny_mma_tile(const uint32_t (&fa)[4][4], uint32_t xs, const int* xo, float s0,
                                                float s8, float (*acc)[4]) {
  float dd[NTH][4];
#pragma unroll
  for (int nt = 0; nt < NTH; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dd[nt][e] = 0.f;
#pragma unroll
  for (int nt = 0; nt < NTH; ++nt) {
    uint4 xa, xb;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(xa.x), "=r"(xa.y), "=r"(xa.z), "=r"(xa.w) : "r"(xs + xo[nt]));
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(xb.x), "=r"(xb.y), "=r"(xb.z), "=r"(xb.w) : "r"(xs + xo[nt] + 16));
    mma_16816<TA>(dd[nt], fa[0], xa.x, xa.y);
    mma_16816<TA>(dd[nt], fa[1], xa.z, xa.w);
    mma_16816<TA>(dd[nt], fa[2], xb.x, xb.y);
    mma_16816<TA>(dd[nt], fa[3], xb.z, xb.w);
  }
#pragma unroll
  for (int nt = 0; nt < NTH; ++nt) {
    acc[nt][0] = fmaf(dd[nt][0], s0, acc[nt][0]);
    acc[nt][1] = fmaf(dd[nt][1], s0, acc[nt][1]);
    acc[nt][2] = fmaf(dd[nt][2], s8, acc[nt][2]);
    acc[nt][3] = fmaf(dd[nt][3], s8, acc[nt][3]);
  }
}

// The end of a thread's cp.async copies issued so far arrives once on the shared-memory mbarrier
// (its count covers every such arrival: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// NT token tiles, S stages, MINB blocks per multiprocessor (the register budget), WG: the wgmma
// form (NT = 4). MB (sm_90, the kernel benchmark's skinny_forms): the stages synchronized by
// mbarriers instead of a block barrier a step: full[s] completes when every thread's copies into
// stage s have landed (cp.async arrivals), empty[s] when the 8 warps have read it; steps are
// loaded S-2 ahead, so that a warp may run one step ahead of the slowest.
template <typename TA, bool DQ, int NT, int S, int MINB, bool WG = false, bool MB = false>
__global__ void __launch_bounds__(kSkinnyW * 32, MINB) gemm_q4_skinny_kernel(const __grid_constant__ Q4SkinnyArgs a) {
  constexpr int W = kSkinnyW, R = kSkinnyR, RS = R / 2, NACC = R * NT * 4, SLICE = NACC * W * 32;
  constexpr int SB = skinny_stage_bytes(NT, WG), TILES = W * R;
  constexpr int D = MB ? S - 2 : S - 1;  // steps loaded ahead
  static_assert(!MB || S >= 3, "gemm_q4_skinny: the mbarrier form needs 3 stages");
  constexpr int OFF_C = WG ? kSkinnyWgTokens * 128 : 0, OFF_A = OFF_C + TILES * 512, OFF_X = WG ? 0 : TILES * (512 + 64);
  static_assert(!WG || (NT == 4 && W * 32 == kSkinnyWgTokens * 8 && SB % 1024 == 0), "gemm_q4_skinny: wgmma form");
  extern __shared__ __align__(16) uint32_t smem_dyn[];  // [256][64] table, then the S stages
  __shared__ float s_nested_code[256];
  __shared__ uint32_t s_bits[16];
  __shared__ __align__(8) uint64_t s_full[MB ? S : 1], s_empty[MB ? S : 1];
  __shared__ int s_last;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dyn));
  const uint32_t lut_s = WG ? (raw_s + 1023u) & ~1023u : raw_s;
  uint32_t* const lut = smem_dyn + (lut_s - raw_s) / 4;
  const uint32_t stage_s = lut_s + kQ4LutBytes;
  const uint32_t lane_b = 4u * lane;
  const int KT = a.KT, G = int(gridDim.x), b = int(blockIdx.x), T = a.T;
  const int64_t N = int64_t(a.units) * KT;
  const int64_t p0 = int64_t(b) * N / G, p1 = int64_t(b + 1) * N / G;
  pdl_trigger();
  if (p0 >= p1) return;  // block-uniform

  // segment of unit u and the unit's index inside it
  auto seg_of = [&](int u, int& ur) {
    int k = 0;
    while (k + 1 < a.nseg && u >= a.unit_end[k]) ++k;
    ur = u - (k ? a.unit_end[k - 1] : 0);
    return k;
  };

  // ---- the copy side: step (lu, lkt) into a stage. Thread tid copies code chunks tid, tid + 256
  // (tile c / 32, 16 bytes c % 32), absmax chunk tid < TILES * (DQ ? 1 : 4) and x chunks tid + 256 i
  // < T * 8 (token c / 8, 16 bytes c % 8). Tiles past the weight's RT are zero-filled.
  int lu = int(p0 / KT), lkt = int(p0 - int64_t(lu) * KT);
  int64_t lp = p0;
  const uint8_t* l_tiles = nullptr;
  const uint8_t* l_abs = nullptr;
  int l_rt0 = 0, l_RT = 0;
  auto start_load_unit = [&]() {
    int ur;
    const Q4SkinnySeg& sg = a.seg[seg_of(lu, ur)];
    l_tiles = sg.tiles;
    l_abs = static_cast<const uint8_t*>(sg.absmax);
    l_rt0 = ur * TILES;
    l_RT = sg.RT;
  };
  const uint8_t* xg = static_cast<const uint8_t*>(a.x);
  auto issue_w = [&](uint32_t st) {  // codes and absmax of step (lu, lkt)
#pragma unroll
    for (int i = 0; i < TILES * 32 / (W * 32); ++i) {
      const int c = tid + i * W * 32, rt = l_rt0 + (c >> 5);
      const bool ok = rt < l_RT;
      const uint8_t* src = l_tiles + ((int64_t(ok ? rt : 0) * KT + lkt) * 32 + (c & 31)) * 16;
      cp_async16_sa(st + OFF_C + c * 16, src, ok);
    }
    constexpr int ACH = DQ ? 1 : 4;  // 16-byte absmax chunks per tile
    if (tid < TILES * ACH) {
      const int tile = tid / ACH, part = tid % ACH, rt = l_rt0 + tile;
      const bool ok = rt < l_RT;
      const uint8_t* src = l_abs + (int64_t(ok ? rt : 0) * KT + lkt) * 16 * (DQ ? 1 : 4) + part * 16;
      cp_async16_sa(st + OFF_A + tile * 64 + part * 16, src, ok);
    }
  };
  // x's 64 columns of column tile kt (tokens < T) into stage st
  auto issue_x = [&](uint32_t st, int kt) {
    if constexpr (WG) {  // thread = (token n, destination chunk c): 4 units from 32 bytes apart
      const int n = tid >> 3, c = tid & 7;
      const uint8_t* src = xg + (int64_t(min(n, T - 1)) * a.cols + int64_t(kt) * 64) * 2 + 4 * c;
      const uint32_t dst = st + OFF_X + n * 128 + ((c ^ (n & 7)) << 4);
#pragma unroll
      for (int i = 0; i < 4; ++i) cp_async4_sa(dst + 4 * i, src + 32 * i, n < T);
    } else {
#pragma unroll
      for (int i = 0; i < (NT * 64 + W * 32 - 1) / (W * 32); ++i) {
        const int c = tid + i * W * 32;
        if (c < T * 8) {
          const int n = c >> 3, ch = c & 7;
          cp_async16_sa(st + OFF_X + n * kSkinnyXRow + ch * 16,
                        xg + (int64_t(n) * a.cols + int64_t(kt) * 64 + ch * 8) * 2, true);
        }
      }
    }
  };
  auto advance_load = [&]() {
    ++lp;
    if (++lkt == KT) {
      lkt = 0;
      ++lu;
      if (lp < p1) start_load_unit();
    }
  };

  // the tables (before the wait: nothing here was written by the previous kernel)
  if (tid < 16) s_bits[tid] = bits16<TA>(a.code[tid]);
  if constexpr (DQ) s_nested_code[tid] = a.nested_code[tid];  // 256 threads
  if constexpr (MB) {
    if (tid == 0)
      for (int s = 0; s < S; ++s) {
        mbar_init(&s_full[s], W * 32);
        mbar_init(&s_empty[s], W);
      }
  }
  __syncthreads();
  q4_fill_lut<64, W * 32>(lut, s_bits);
  const Q4RegTable tb = q4_reg_table(s_bits);  // code word 0 of each tile: byte permutes, no LDS
  // The first S-1 steps' weights before the wait (the previous kernel never writes them: their
  // loads overlap its tail), their x after it; all in the first commit group with x of step p0,
  // then one group per step's x.
  start_load_unit();
  int pro = 0;
  for (; pro < D && lp < p1; ++pro) {
    issue_w(stage_s + pro * SB);
    advance_load();
  }
  pdl_wait();
#pragma unroll
  for (int s = 0; s < D; ++s) {
    if (s < pro) issue_x(stage_s + s * SB, int((p0 + s) % KT));
    if constexpr (MB) {
      if (s < pro) cp_async_mbar_arrive(&s_full[s]);
    } else {
      cp_async_commit();
    }
  }

  // ---- the compute side: step (cu, ckt)
  int cu = int(p0 / KT), ckt = int(p0 - int64_t(cu) * KT);
  int64_t cp = p0;
  float offset = 0.f;
  const float* c_nest = nullptr;
  int64_t c_rowc[RS];  // DQ: row * cols of the lane's absmax rows (pair q: tile 2q + lane / 16, row lane % 16)
  auto start_compute_unit = [&]() {
    int ur;
    const Q4SkinnySeg& sg = a.seg[seg_of(cu, ur)];
    offset = sg.offset;
    c_nest = sg.nested_absmax;
#pragma unroll
    for (int q = 0; q < RS; ++q)
      c_rowc[q] = min(int64_t(ur * TILES + warp * R + 2 * q + (lane >> 4)) * 16 + (lane & 15), sg.rows - 1) * a.cols;
  };
  start_compute_unit();
  // this lane's x rows in a stage: token min(8 nt + g, T - 1), bytes 32 t ..
  int xo[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) xo[nt] = min(8 * nt + g, T - 1) * kSkinnyXRow + 32 * t;
  float acc[R][NT][4];
  auto zero_acc = [&]() {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][nt][e] = 0.f;
  };
  zero_acc();

  // The end of unit cu's steps in this block: store it, or hand the block's part to the workspace.
  auto finish_unit = [&]() {
    int ur;
    const Q4SkinnySeg& sg = a.seg[seg_of(cu, ur)];
    const int first = skinny_owner(int64_t(cu) * KT, N, G), last = skinny_owner(int64_t(cu) * KT + KT - 1, N, G);
    if (first != last) {
      float* slot = a.partial + (int64_t(cu) + b) * SLICE + tid;
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) __stcg(slot + ((r * NT + nt) * 4 + e) * (W * 32), acc[r][nt][e]);
      __threadfence();
      __syncthreads();
      if (tid == 0) s_last = atomicAdd(a.tickets + cu, 1) == last - first;
      __syncthreads();
      if (!s_last) return;
      __threadfence();
      zero_acc();
      // two slots' loads in flight at a time, added in slot order
      const float* src = a.partial + (int64_t(cu) + first) * SLICE + tid;
      int bb = first;
      for (; bb + 1 <= last; bb += 2, src += 2 * SLICE) {
        float v0[NACC], v1[NACC];
#pragma unroll
        for (int i = 0; i < NACC; ++i) {
          v0[i] = __ldcg(src + i * (W * 32));
          v1[i] = __ldcg(src + SLICE + i * (W * 32));
        }
#pragma unroll
        for (int i = 0; i < NACC; ++i) (&acc[0][0][0])[i] = (&acc[0][0][0])[i] + v0[i] + v1[i];
      }
      if (bb == last) {
#pragma unroll
        for (int i = 0; i < NACC; ++i) (&acc[0][0][0])[i] += __ldcg(src + i * (W * 32));
      }
      if (tid == 0) a.tickets[cu] = 0;  // every part has taken its ticket: ready for the next launch
    }
    const int rt0 = ur * TILES + warp * R;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t row = int64_t(rt0 + r) * 16 + g + (e >> 1) * 8;
          const int n = 8 * nt + 2 * t + (e & 1);
          if (row >= sg.rows || n >= T) continue;
          float y = acc[r][nt][e];
          if (sg.bias) y += sg.bias[row];
          if (a.out_f32) static_cast<float*>(sg.out)[n * sg.rows + row] = y;
          else static_cast<TA*>(sg.out)[n * sg.rows + row] = from_f32<TA>(y);
        }
  };

  int cslot = 0, lslot = D;
  unsigned cpar = 0;  // MB: parity of the full[cslot] phase step cp waits for
  int lwrap = 0;      // MB: times the load position has wrapped (its empty[] waits start at the first)
  int uslot = 0;      // MB: step cp's stage, released by release_step
  // The start of step cp: its stage landed (for every thread) and the loads of step lp issued into
  // the stage step cp - 1 used (its reads, wgmmas included, completed before the barrier). Returns
  // step cp's stage.
  auto begin_step = [&]() -> uint32_t {
    if constexpr (MB) {  // step lp into the stage of step lp - S, once every warp has read it
      if (lp < p1) {
        if (lwrap > 0) mbar_wait(&s_empty[lslot], unsigned(lwrap - 1) & 1u);
        issue_w(stage_s + lslot * SB);
        issue_x(stage_s + lslot * SB, lkt);
        advance_load();
        cp_async_mbar_arrive(&s_full[lslot]);
      }
      if (++lslot == S) lslot = 0, ++lwrap;
      mbar_wait(&s_full[cslot], cpar);
      if constexpr (WG) fence_proxy_async_smem();  // the copies' writes visible to wgmma's reads
      uslot = cslot;
      const uint32_t st = stage_s + cslot * SB;
      if (++cslot == S) cslot = 0, cpar ^= 1u;
      return st;
    }
    cp_async_wait<D - 1>();
    if constexpr (WG) fence_proxy_async_smem();  // the copies' writes visible to wgmma's reads
    __syncthreads();
    if (lp < p1) {
      issue_w(stage_s + lslot * SB);
      issue_x(stage_s + lslot * SB, lkt);
      advance_load();
    }
    cp_async_commit();
    lslot = lslot + 1 == S ? 0 : lslot + 1;
    const uint32_t st = stage_s + cslot * SB;
    cslot = cslot + 1 == S ? 0 : cslot + 1;
    return st;
  };
  // MB: the warp has read step cp's stage (its wgmmas completed).
  auto release_step = [&]() {
    if constexpr (MB) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&s_empty[uslot]);
    }
  };
  // The absmax of step cp's stage st: lane l holds row l % 16 of the warp's row tile 2q + l / 16.
  auto load_scales = [&](uint32_t st, float (&sv)[RS]) {
#pragma unroll
    for (int q = 0; q < RS; ++q) {
      const uint32_t aa = st + OFF_A + (warp * R + 2 * q + (lane >> 4)) * 64;
      if constexpr (DQ) {
        uint32_t code;
        asm volatile("ld.shared.u8 %0, [%1];" : "=r"(code) : "r"(aa + (lane & 15)));
        const float nab = __ldg(c_nest + (((c_rowc[q] + int64_t(ckt) * 64) >> a.log2_blocksize) >> a.log2_nested));
        sv[q] = __fadd_rn(__fmul_rn(s_nested_code[code], nab), offset);
      } else {
        asm volatile("ld.shared.f32 %0, [%1];" : "=f"(sv[q]) : "r"(aa + 4 * (lane & 15)));
      }
    }
  };
  // Row tile r's absmax of rows g (s0) and g + 8 (s8) from load_scales' values.
  auto scale_of = [&](const float (&sv)[RS], int r, float& s0, float& s8) {
    s0 = __shfl_sync(0xffffffffu, sv[r / 2], g + 16 * (r & 1));
    s8 = __shfl_sync(0xffffffffu, sv[r / 2], g + 8 + 16 * (r & 1));
  };
  // Row tile r's 4 code words of stage st as the A fragments of its 4 K steps.
  auto decode = [&](uint32_t st, int r, uint32_t (&fa)[4][4]) {
    uint4 wq;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(wq.x), "=r"(wq.y), "=r"(wq.z), "=r"(wq.w)
                 : "r"(st + OFF_C + ((warp * R + r) * 32 + lane) * 16));
    q4_word_prmt(tb, wq.x, fa[0]);
    q4_word_lds(lut_s, lane_b, wq.y, fa[1]);
    q4_word_lds(lut_s, lane_b, wq.z, fa[2]);
    q4_word_lds(lut_s, lane_b, wq.w, fa[3]);
  };
  // The end of step cp: the unit's store or hand-off at its last step; true after the block's last.
  auto end_step = [&]() -> bool {
    ++cp;
    if (++ckt == KT || cp == p1) {  // block-uniform
      finish_unit();
      if (cp == p1) return true;
      zero_acc();
      ckt = 0;
      ++cu;
      start_compute_unit();
    }
    return false;
  };

  if constexpr (!WG) {
    for (; cp < p1;) {
      const uint32_t st = begin_step();
      float sv[RS];
      load_scales(st, sv);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float s0, s8;
        scale_of(sv, r, s0, s8);
        uint32_t fa[4][4];
        decode(st, r, fa);
#pragma unroll
        for (int h = 0; h < (NT + 3) / 4; ++h) {
          constexpr int NTH = NT < 4 ? NT : 4;
          skinny_mma_tile<TA, NTH>(fa, st + OFF_X, &xo[h * NTH], s0, s8, &acc[r][h * NTH]);
        }
      }
      release_step();
      if (end_step()) break;
    }
  } else {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __trap();  // launched only from the sm_90a build (gemm_q4_skinny_wgmma_supported)
#endif
    constexpr bool BF = std::is_same_v<TA, __nv_bfloat16>;
    for (; cp < p1;) {
      const uint32_t st = begin_step();
      float sv[RS];
      load_scales(st, sv);
      uint32_t A[R][4][4];
      float P[R][16], c0[R], c8[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        scale_of(sv, r, c0[r], c8[r]);
        decode(st, r, A[r]);
      }
      const uint64_t db = wgmma_desc_sw128(st + OFF_X);
      wgmma_fence();
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wgmma_fence_regs(P[r]);
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_rs<kSkinnyWgTokens, BF>(P[r], A[r][k], db + 2 * k, k);
      }
      wgmma_commit();
      wgmma_wait<0>();
      release_step();
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wgmma_fence_regs(P[r]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          acc[r][nt][0] = fmaf(P[r][4 * nt], c0[r], acc[r][nt][0]);
          acc[r][nt][1] = fmaf(P[r][4 * nt + 1], c0[r], acc[r][nt][1]);
          acc[r][nt][2] = fmaf(P[r][4 * nt + 2], c8[r], acc[r][nt][2]);
          acc[r][nt][3] = fmaf(P[r][4 * nt + 3], c8[r], acc[r][nt][3]);
        }
      }
      if (end_step()) break;
    }
  }
  if constexpr (MB) cp_async_commit();  // the mbarrier form's copies were never committed
  cp_async_wait<0>();  // no copy may land after the block exits
}

// Host side (ops_gemm_q4_skinny.cu): a launch's kernel arguments and grid, the workspace checked.
Q4SkinnyArgs skinny_kernel_args(const GemmQ4SkinnyArgs& g, int& grid);

// One launch of the kernel instance TA, DQ, NT, S (one block per SM), WG, MB with g's arguments and grid
// (its dynamic shared memory opted in at the first launch).
template <typename TA, bool DQ, int NT, int S, bool WG, bool MB = false>
void skinny_launch(const GemmQ4SkinnyArgs& g, cudaStream_t st) {
  constexpr auto kernel = gemm_q4_skinny_kernel<TA, DQ, NT, S, 1, WG, MB>;
  constexpr int smem = skinny_smem_bytes(NT, S, WG);
  static const bool opted_in = [] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)opted_in;
  int grid = 0;
  const Q4SkinnyArgs k = skinny_kernel_args(g, grid);
  launch_k(kernel, dim3(unsigned(grid)), dim3(kSkinnyW * 32), size_t(smem), st, k);
  CUDA_CHECK_LAUNCH();
}

// f(TA{}, std::bool_constant<DQ>{}) for the launch's compute dtype and absmax form (bf16/f16).
template <typename F>
void skinny_dispatch(const GemmQ4SkinnyArgs& g, F&& f) {
  const bool dq = g.w[0]->double_quant;
  if (g.act == DType::BF16) {
    if (dq) f(__nv_bfloat16{}, std::true_type{});
    else f(__nv_bfloat16{}, std::false_type{});
  } else if (g.act == DType::F16) {
    if (dq) f(__half{}, std::true_type{});
    else f(__half{}, std::false_type{});
  } else {
    fail("gemm_q4_skinny: compute dtype ", dtype_name(g.act), " not supported (bf16/f16)");
  }
}

}  // namespace nf4flash::cuda
