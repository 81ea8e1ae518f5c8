// Launcher of the fused 4-bit GEMM (kernels/gemm_q4_wgmma_ws.cuh): the configuration per launch
// from a wave model, and the split tail. Compiled for sm_90a (wgmma is an arch-specific feature;
// CMakeLists.txt) when the build targets 90; built without it, gemm_q4_wgmma_built() is false and
// the backend keeps dequantize + cuBLAS.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>


#include "backend/cuda/kernels/gemm_q4_wgmma.cuh"
#include "backend/cuda/kernels/gemm_q4_wgmma_ws.cuh"
#include "backend/cuda/sm90a/tensor_map.h"

namespace nf4flash::cuda {

namespace {

// The warp-specialized kernel's configurations: BN tokens a block, S pipeline stages, KS column
// tiles a consumer step (2 needs an even number of column tiles a block; the KS = 1 forms of n32 and
// n64 serve the others), and the measured time of one block (unit) per 4096 columns. n64 / n128 /
// n256: H200, nf4-dq, T=512 (one-wave launches 1024x4096 n64 35.9 us, 4096x4096 n128 44.8 / n256
// 59.6; 14336x4096 n128 4 waves 172.4, n256 2 waves 121.5). n32 and the KS = 2 forms: H100,
// one-wave 14336x4096 at 32 / 64 rows: n32s16k2 31.1, n32s16 32.3, n64s12k2 34.7, n64s8 35.2 us.
// f32 output (the prompt's logits) takes ws-n128s6 alone.
struct Cfg {
  const char* name;
  int bn, stages, ks;
  double unit_us;
};
constexpr Cfg kCfgs[] = {{"ws-n32s16k2", 32, 16, 2, 31.1}, {"ws-n32s16", 32, 16, 1, 32.3},
                         {"ws-n64s12k2", 64, 12, 2, 34.7}, {"ws-n64s8", 64, 8, 1, 35.2},
                         {"ws-n128s6", 128, 6, 1, 44.0},   {"ws-n256s4", 256, 4, 1, 60.0}};
constexpr const Cfg& kCfgF32 = kCfgs[4];
static_assert(kCfgs[4].bn == 128 && kCfgs[4].ks == 1, "the f32-output configuration");

int device_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 132;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// Configuration for rb row blocks (of 8 row tiles; all weights of the launch) x T tokens. A
// block's time hardly shrinks with its token tile (prologue, pipeline fill, decode latency), so
// the pick is by waves: minimize ceil(blocks / SMs) x unit_us of that tile. Over n64 / n128 / n256
// it reproduced every measured pick at T=512 (14336x4096 n256, 4096x14336 and 4096x4096 n128,
// 1024x4096 n64) and n256 on every shape at T=4096; a batched decode step's 9-64 rows take n32 or
// n64.
const Cfg& pick(int64_t T, DType out_dtype, int64_t rb, int64_t K) {
  if (out_dtype == DType::F32) return kCfgF32;
  const int64_t sms = std::max(1, device_sms());
  const Cfg* best = nullptr;
  double best_cost = 0;
  for (const Cfg& c : kCfgs) {
    if ((K / 64) % c.ks) continue;  // a block's column tiles come in steps of ks
    const int64_t blocks = rb * ((T + c.bn - 1) / c.bn);
    const double cost = double((blocks + sms - 1) / sms) * c.unit_us;
    if (!best || cost < best_cost || (cost == best_cost && c.bn > best->bn)) best = &c, best_cost = cost;
  }
  return *best;
}

// A launch's schedule: configuration, and the split tail (kernels/gemm_q4_wgmma_ws.cuh): units
// [dp_units, units) split `split` ways (split 1: none).
struct Sched {
  const Cfg* cfg;
  int split = 1;
  int64_t units = 0, dp_units = 0;
};

// The DP + split-tail schedule of c with s splits: whole waves of units run unsplit, the units of
// the last, partial wave (all of them when there is less than a wave) split s ways. Not splittable
// (returns split 1) when there is no partial wave, K's column tiles do not make s non-empty
// splits of whole steps of c.ks tiles, or the workspace is too small.
Sched tail_sched(const Cfg& c, int64_t T, int64_t rb, int64_t K, int s, const Q4SplitWs& ws) {
  const int64_t sms = std::max(1, device_sms());
  const int64_t units = rb * ((T + c.bn - 1) / c.bn);
  Sched r{&c, 1, units, units};
  const int64_t tail = units % sms;
  const int64_t KT = K / 64, kps = (KT + s - 1) / s;
  if (s <= 1 || tail == 0 || (KT + kps - 1) / kps != s || KT % c.ks || kps % c.ks) return r;
  if (tail > ws.n_tickets || tail * s * c.bn * 128 > ws.floats || !ws.partial || !ws.tickets) return r;
  r.split = s;
  r.dp_units = units - tail;
  return r;
}

// Modelled time: waves x unit time; split units take 1/s of it plus a block's fixed cost (~2 us:
// table fill, pipeline fill) and the slice traffic (each split writes BN x 128 floats, the last
// one reads them back; ~45 GB/s per SM from L2).
double sched_us(const Sched& sc, int64_t K) {
  const double sms = std::max(1, device_sms()), t = sc.cfg->unit_us * double(K) / 4096.0;
  const double whole = std::ceil(double(sc.dp_units) / sms) * t;
  if (sc.split == 1) return whole;
  const double tail_blocks = double(sc.units - sc.dp_units) * sc.split;
  const double slices = 2.0 + double(sc.cfg->bn) * 128 * 4 * 2 / 45e3;
  return std::floor(double(sc.dp_units) / sms) * t + std::ceil(tail_blocks / sms) * (t / sc.split + slices);
}

// The schedule of a launch: pick()'s configuration unsplit, unless a split tail (2-4 ways, any
// configuration) is predicted 5% faster; 16-bit output only.
Sched pick_sched(int64_t T, DType out_dtype, int64_t rb, int64_t K, DType act, const Q4SplitWs& ws) {
  const Cfg& base = pick(T, out_dtype, rb, K);
  Sched best = tail_sched(base, T, rb, K, 1, ws);
  if (out_dtype != act) return best;
  const double unsplit = sched_us(best, K);
  double best_us = 0.95 * unsplit;
  for (int s : {2, 3, 4})
    for (const Cfg& cfg : kCfgs) {
      const Sched c = tail_sched(cfg, T, rb, K, s, ws);
      if (c.split != s) continue;
      if (const double us = sched_us(c, K); us < best_us) best = c, best_us = us;
    }
  return best;
}

// The dynamic shared-memory opt-in, once per kernel (the template argument is the kernel itself).
template <auto Kernel>
void smem_opt_in(int smem) {
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set = true;
  }
}

// One launch over the weights of m (1-3): x [T, cols] as a 2D tensor map (boxes of BN rows x 64
// columns, 128-byte swizzle); each weight's codes as [RT, KT * 128 u32] (boxes of one 512-byte
// column tile x 8 row tiles) and absmax as [RT, KT * 16] f32 or u8 (boxes of 16 x 8).
template <typename TA, typename TO, bool DQ, int BN, int S, int KS>
void launch_ws(const GemmQ4MultiArgs& m, cudaStream_t st, const Sched& sc) {
  constexpr auto kernel = gemm_q4_ws_kernel<TA, TO, DQ, BN, S, KS>;
  constexpr int smem = q4g_ws_smem_bytes(BN, S);
  constexpr uint32_t rtw = 8;
  NF4FLASH_CHECK(reinterpret_cast<uintptr_t>(m.x) % 16 == 0, "gemm_q4_wgmma: x not 16-byte aligned");
  const Q4Device& w0 = *m.w[0];
  Q4gWsParams p{};
  p.xmap = tensor_map_2d(
      std::is_same_v<TA, __nv_bfloat16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, m.x,
      w0.cols, m.T, w0.cols * 2, 64, BN, CU_TENSOR_MAP_SWIZZLE_128B, "x");
  int64_t blocks = 0;
  for (int i = 0; i < m.nseg; ++i) {
    const Q4Device& w = *m.w[i];
    p.wmap[i] = tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT32, w.tiles, w.KT * 128, w.RT, w.KT * 512, 128, rtw,
                              CU_TENSOR_MAP_SWIZZLE_NONE, "codes");
    p.smap[i] = DQ ? tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, w.absq_tiled, w.KT * 16, w.RT, w.KT * 16, 16, rtw,
                                   CU_TENSOR_MAP_SWIZZLE_NONE, "absmax codes")
                   : tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, w.absmax_tiled, w.KT * 16, w.RT, w.KT * 64, 16,
                                   rtw, CU_TENSOR_MAP_SWIZZLE_NONE, "absmax");
    p.w[i] = w;
    p.bias[i] = m.bias[i];
    p.out[i] = m.out[i];
    blocks += (w.RT + rtw - 1) / rtw;
    NF4FLASH_CHECK(blocks <= 0x7fffffff, "gemm_q4_wgmma: too many row blocks");
    p.blk_end[i] = int(blocks);
  }
  p.nseg = m.nseg;
  p.T = int(m.T);
  const int KT = int(w0.KT);
  p.n_rb = int(blocks);
  const int64_t gy = (m.T + BN - 1) / BN;
  p.n_tt = int(gy);
  const int64_t units = blocks * gy, grid = units + (sc.split == 1 ? 0 : (units - sc.dp_units) * (sc.split - 1));
  NF4FLASH_CHECK(grid <= 0x7fffffff, "gemm_q4_wgmma: grid of ", grid, " blocks too large");
  NF4FLASH_CHECK(sc.cfg->bn == BN && sc.cfg->stages == S && sc.cfg->ks == KS && (sc.split == 1 || sc.units == units),
                 "gemm_q4_wgmma: schedule of another configuration");
  p.dp_units = int(sc.split == 1 ? units : sc.dp_units);
  p.ksplit = sc.split;
  p.kps = (KT + sc.split - 1) / sc.split;
  NF4FLASH_CHECK(KT % KS == 0 && p.kps % KS == 0, "gemm_q4_wgmma: ", KT, " column tiles (", p.kps,
                 " a split) in steps of ", KS);
  NF4FLASH_CHECK(sc.split == 1 || ((KT + p.kps - 1) / p.kps == sc.split && m.split.partial && m.split.tickets),
                 "gemm_q4_wgmma: split tail without a workspace or with an empty split");
  p.partial = m.split.partial;
  p.tickets = m.split.tickets;
  smem_opt_in<kernel>(smem);
  kernel<<<dim3(unsigned(grid)), dim3(kQ4gWsThreads), smem, st>>>(p);
  CUDA_CHECK_LAUNCH();
}

// The launch of m's weights with schedule sc (the configuration's BN and stages as template arguments).
template <typename TA, typename TO, bool DQ>
void launch_sched(const GemmQ4MultiArgs& m, cudaStream_t st, const Sched& sc) {
  if constexpr (std::is_same_v<TO, float>) {  // the n128 configuration only
    launch_ws<TA, TO, DQ, 128, 6, 1>(m, st, sc);
  } else {
    const Cfg& c = *sc.cfg;
    if (c.bn == 32 && c.ks == 2) launch_ws<TA, TO, DQ, 32, 16, 2>(m, st, sc);
    else if (c.bn == 32) launch_ws<TA, TO, DQ, 32, 16, 1>(m, st, sc);
    else if (c.bn == 64 && c.ks == 2) launch_ws<TA, TO, DQ, 64, 12, 2>(m, st, sc);
    else if (c.bn == 64) launch_ws<TA, TO, DQ, 64, 8, 1>(m, st, sc);
    else if (c.bn == 128) launch_ws<TA, TO, DQ, 128, 6, 1>(m, st, sc);
    else launch_ws<TA, TO, DQ, 256, 4, 1>(m, st, sc);
  }
}

int device_cc() {
  static int cc = [] {
    int dev = 0, ma = 0, mi = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&ma, cudaDevAttrComputeCapabilityMajor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&mi, cudaDevAttrComputeCapabilityMinor, dev));
    return ma * 10 + mi;
  }();
  return cc;
}

}  // namespace

bool gemm_q4_wgmma_built() {
#if defined(NF4FLASH_SM90A_BUILD)
  return true;
#else
  return false;
#endif
}

bool gemm_q4_wgmma_supported() { return gemm_q4_wgmma_built() && device_cc() == 90; }

namespace {
// What both entry points require of the device, T and (the first) weight.
void check_launch(int64_t T, const Q4Device& w) {
  NF4FLASH_CHECK(gemm_q4_wgmma_supported(), "gemm_q4_wgmma: needs a compute capability 9.0 GPU and a build for sm_90a");
  NF4FLASH_CHECK(T >= 1 && T <= int64_t(65535) * 64, "gemm_q4_wgmma: T=", T, " out of range");
  NF4FLASH_CHECK(w.cols % 64 == 0 && w.KT == w.cols / 64, "gemm_q4_wgmma: cols ", w.cols, " not a multiple of 64");
}
}  // namespace

std::string gemm_q4_wgmma_cfg(int64_t T, DType out_dtype, int64_t row_blocks, int64_t K) {
  return pick(T, out_dtype, row_blocks, K).name;
}

void gemm_q4_wgmma(const GemmQ4Args& g, cudaStream_t st) {
  const Q4Device& w = *g.w;
  check_launch(g.T, w);
  NF4FLASH_CHECK(g.out_dtype == g.act || g.out_dtype == DType::F32, "gemm_q4_wgmma: output dtype ",
                 dtype_name(g.out_dtype));
  GemmQ4MultiArgs m;
  m.w[0] = &w;
  m.bias[0] = g.bias;
  m.out[0] = g.out;
  m.x = g.x;
  m.act = g.act;
  m.T = g.T;
  m.split = g.split;
  const Sched sc = pick_sched(g.T, g.out_dtype, (w.RT + 7) / 8, w.cols, g.act, g.split);
  auto go = [&](auto ta) {
    using TA = decltype(ta);
    if (g.out_dtype == DType::F32) {
      if (w.double_quant) launch_sched<TA, float, true>(m, st, sc);
      else launch_sched<TA, float, false>(m, st, sc);
    } else {
      if (w.double_quant) launch_sched<TA, TA, true>(m, st, sc);
      else launch_sched<TA, TA, false>(m, st, sc);
    }
  };
  if (g.act == DType::BF16) go(__nv_bfloat16{});
  else if (g.act == DType::F16) go(__half{});
  else fail("gemm_q4_wgmma: compute dtype ", dtype_name(g.act), " not supported (bf16/f16)");
}

void gemm_q4_wgmma_multi(const GemmQ4MultiArgs& m, cudaStream_t st) {
  NF4FLASH_CHECK(m.nseg >= 1 && m.nseg <= kQ4gMaxSegs, "gemm_q4_wgmma_multi: ", m.nseg, " weights");
  const Q4Device& w0 = *m.w[0];
  check_launch(m.T, w0);
  int64_t rb = 0;
  for (int i = 0; i < m.nseg; ++i) {
    const Q4Device& w = *m.w[i];
    // (the nested code table is taken from weight 0: the caller checks the tables are equal)
    NF4FLASH_CHECK(w.cols == w0.cols && w.double_quant == w0.double_quant && std::equal(w.code, w.code + 16, w0.code),
                   "gemm_q4_wgmma_multi: weight ", i, " differs from weight 0 in cols or quantization parameters");
    rb += (w.RT + 7) / 8;
  }
  const Sched sc = pick_sched(m.T, m.act, rb, w0.cols, m.act, m.split);
  auto go = [&](auto ta) {
    using TA = decltype(ta);
    if (w0.double_quant) launch_sched<TA, TA, true>(m, st, sc);
    else launch_sched<TA, TA, false>(m, st, sc);
  };
  if (m.act == DType::BF16) go(__nv_bfloat16{});
  else if (m.act == DType::F16) go(__half{});
  else fail("gemm_q4_wgmma: compute dtype ", dtype_name(m.act), " not supported (bf16/f16)");
}

}  // namespace nf4flash::cuda
