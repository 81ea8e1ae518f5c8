// Fused 4-bit GEMM, warp-specialized (wgmma + TMA, sm_90a): the same product and arithmetic as
// gemm_q4_wgmma_kernel (kernels/gemm_q4_wgmma.cuh; same decode into RS wgmma A fragments, same
// epilogue), with the copies moved off the compute warps:
//   warps 0-3  producer warpgroup (setmaxnreg down to 40 registers): lane 0 of warp 0 walks the K
//              loop S stages ahead, per column tile kt issuing three TMA tile copies that complete
//              on the stage's `full` mbarrier: x [BN x 64] (tensor map over x [T, cols], 128-byte
//              swizzle = wgmma's B layout), the block's 8 row tiles of codes [8 x 512 bytes]
//              (tensor map over the tiles as [RT, KT * 512 bytes]) and their absmax [8 x 64 or 16
//              bytes] (over [RT, KT * 64 or 16 bytes]); rows past T or RT arrive zero-filled;
//   warps 4-11 two consumer warpgroups (setmaxnreg up to 232), 64 weight rows each (consumer warp
//              c = warp - 4 decodes row tile c), BN tokens.
// Consumers issue tile kt's 4 wgmma m64nBNk16, decode tile kt + 1 (waiting on its full[slot])
// while those run, then, once tile kt - 1's group has completed (wgmma_wait<1>), release that
// tile's slot: one arrival per warp on empty[slot] (8 per phase). No block-wide barrier in the K
// loop: the warpgroups drift freely.
// Grid as the cp.async kernel: (ceil(RT / 8), ceil(T / BN)); 384 threads.
// Shared memory: [S][BN*128] x tiles (1024-aligned), [S][8][512] codes, [S][8][64 or 16] absmax,
// the [256][64]-word code-pair table, 16 codes, 256 nested codes, 2S mbarriers.
#pragma once
#include "backend/cuda/kernels/gemm_q4_wgmma.cuh"
#include "backend/cuda/kernels/mbarrier.cuh"

namespace nf4flash::cuda {

constexpr int kQ4gWsThreads = 384;
__host__ __device__ constexpr int q4g_ws_smem_bytes(int bn, int s) {
  return 1024 + s * (bn * 128 + 8 * (512 + 64)) + q4_lut_bytes(2) + (16 + 256) * 4 + 2 * s * 8;  // absmax: 64 (f32) max
}

template <typename TA, typename TO, bool DQ, int BN, int S>
__global__ void __launch_bounds__(kQ4gWsThreads, 1)
    gemm_q4_ws_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
                      const __grid_constant__ CUtensorMap smap, const __grid_constant__ Q4GemmKArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int RTB = 8, ABS = DQ ? 16 : 64, XS = BN * 128, WS = RTB * 512, SS = RTB * ABS;
  static_assert(S >= 2, "gemm_q4_ws: stages");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base_s = (raw_s + 1023u) & ~1023u;
  const uint32_t xs_s = base_s, wq_s = xs_s + S * XS, sc_s = wq_s + S * WS, lut_s = sc_s + S * SS;
  uint32_t* const lut = reinterpret_cast<uint32_t*>(smem_raw + (lut_s - raw_s));
  uint32_t* const s_bits = lut + q4_lut_bytes(2) / 4;
  float* const s_nested = reinterpret_cast<float*>(s_bits + 16);
  uint64_t* const full = reinterpret_cast<uint64_t*>(s_nested + 256);
  uint64_t* const empty = full + S;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int KT = int(a.w.KT);
  const int64_t rt0 = int64_t(blockIdx.x) * RTB;
  const int n0 = int(blockIdx.y) * BN;
  if (tid < 16) s_bits[tid] = bits16<TA>(a.w.code[tid]);
  if constexpr (DQ) {
    for (int i = tid; i < 256; i += kQ4gWsThreads) s_nested[i] = a.w.nested_code[i];
  }
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  q4_fill_lut<64>(lut, s_bits);
  __syncthreads();

  if (warp < 4) {  // ---- producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (warp == 0 && lane == 0) {
      constexpr uint32_t bytes = uint32_t(XS + WS + SS);
      const int row0 = int(rt0);
      for (int kt = 0; kt < KT; ++kt) {
        const int slot = kt % S;
        if (kt >= S) mbar_wait(&empty[slot], uint32_t((kt / S) + 1) & 1u);
        mbar_expect_tx(&full[slot], bytes);
        tma_load_2d(xs_s + slot * XS, &xmap, kt * 64, n0, &full[slot]);
        tma_load_2d(wq_s + slot * WS, &wmap, kt * 128, row0, &full[slot]);
        tma_load_2d(sc_s + slot * SS, &smap, kt * 16, row0, &full[slot]);  // 16 absmax per row tile
      }
    }
    return;
  }

  // ---- consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int cw = warp - 4;  // consumer warp: row tile cw, warpgroup cw / 4
  const int64_t my_rt = rt0 + cw;
  const Q4gNested<DQ> nested(a.w, my_rt, g);
  float nab0 = 0.f, nab1 = 0.f;
  nested.load(a.w, 0, nab0, nab1);
  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  const uint32_t lane4 = 4u * lane;

  // Software-pipelined: issue tile kt's wgmmas (A decoded one step earlier), then decode tile
  // kt + 1 while they (and kt - 1's) run, then wait for kt - 1's group and release its slot. Three
  // A register sets: kt - 1's and kt's stay untouched while their groups are in flight.
  auto decode = [&](int kt, uint32_t (&A)[16]) {
    const int slot = kt % S;
    mbar_wait(&full[slot], uint32_t(kt / S) & 1u);
    q4g_decode_a<TA, DQ>(wq_s + slot * WS + cw * 512 + lane * 16, sc_s + slot * SS + cw * ABS, lut_s, lane4, g,
                         t, s_nested, nab0, nab1, a.w.offset, A);
    if (DQ && kt + 1 < KT) nested.load(a.w, kt + 1, nab0, nab1);
  };
  auto step = [&](int kt, const uint32_t (&Ai)[16], uint32_t (&An)[16]) {
    q4g_mma_tile<TA, BN>(acc, Ai, xs_s + (kt % S) * XS);
    if (kt + 1 < KT) decode(kt + 1, An);
    wgmma_wait<1>();  // tile kt - 1's group is done: its slot may be refilled
    if (kt > 0) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[(kt - 1) % S]);
    }
  };

  uint32_t A0[16], A1[16], A2[16];
  decode(0, A0);
  int kt = 0;
  for (; kt + 2 < KT; kt += 3) {
    step(kt, A0, A1);
    step(kt + 1, A1, A2);
    step(kt + 2, A2, A0);
  }
  if (kt < KT) step(kt, A0, A1);
  if (kt + 1 < KT) step(kt + 1, A1, A2);
  wgmma_wait<0>();
  wgmma_fence_regs(acc);
  q4g_store<TO, BN>(a, acc, my_rt * 16 + g, n0, t);
#else
  __trap();  // built only for sm_90a (gemm_q4_wgmma_supported() says so before any launch)
#endif
}

}  // namespace nf4flash::cuda
