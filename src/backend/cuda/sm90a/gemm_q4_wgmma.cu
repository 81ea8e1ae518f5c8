// Launcher of the fused 4-bit GEMM (kernels/gemm_q4_wgmma.cuh). This file alone is compiled for
// sm_90a (wgmma is an arch-specific feature; CMakeLists.txt) when the build targets 90; built
// without it, gemm_q4_wgmma_built() is false and the backend keeps dequantize + cuBLAS.
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

struct Cfg {
  const char* name;
  bool ws;  // warp-specialized (TMA producer warp) or the cp.async kernel
  int bn, stages;
  bool f32_out;  // instantiated with an f32 output too
};
// Every instantiated configuration (kernel-bench sweeps them, the gpu tests run each).
constexpr Cfg kCfgs[] = {
    {"ws-n64s8", true, 64, 8, false},  {"ws-n128s6", true, 128, 6, true}, {"ws-n256s4", true, 256, 4, false},
    {"w2n64s4", false, 64, 4, false},  {"w2n128s4", false, 128, 4, true}, {"w2n256s4", false, 256, 4, false},
};
constexpr int kNumCfgs = int(sizeof(kCfgs) / sizeof(kCfgs[0]));

int device_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 132;
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

// Block order (NF4FLASH_Q4GEMM_RASTER): "col" (default) runs all row blocks of one token tile
// before the next (x tile shared, weights streamed once per token tile); "row" runs the token
// tiles of one row block together (weights read once, x from L2).
bool raster_rows() {
  const char* v = std::getenv("NF4FLASH_Q4GEMM_RASTER");  // per launch: kernel-bench switches it
  if (!v || !*v) return false;
  const std::string_view m(v);
  NF4FLASH_CHECK(m == "row" || m == "col", "NF4FLASH_Q4GEMM_RASTER=", m, ": expected row or col");
  return m == "row";
}

const Cfg& find_cfg(std::string_view name) {
  for (const Cfg& c : kCfgs)
    if (name == c.name) return c;
  std::string known;
  for (const Cfg& c : kCfgs) known += cat(known.empty() ? "" : ", ", c.name);
  fail("NF4FLASH_Q4GEMM_CFG=", name, ": unknown configuration (", known, ")");
}

// Configuration for rb row blocks (of 8 row tiles; all weights of the launch) x T tokens. A
// block's time hardly shrinks with its token tile (prologue, pipeline fill, decode latency), so
// the pick is by waves: minimize ceil(blocks / SMs) x the time of one block of that tile, per
// 4096 columns on the H200: n64 30 us, n128 36, n256 55 (kernel-bench "prefill" rows, c0fa985,
// nf4-dq, one-wave launches: 1024x4096 n64 31.6, 4096x4096 n128 38.4 / n256 51.8 at T=512). The
// model reproduces every measured pick: T=512 14336x4096 n256 (105.9 us, n128 151.4),
// 4096x14336 n128 (123.7; n256 165.7), 1024x4096 n64; T=4096 n256 on every shape.
const Cfg& pick(int64_t T, DType out_dtype, int64_t rb) {
  if (const char* v = std::getenv("NF4FLASH_Q4GEMM_CFG"); v && *v) {
    const Cfg& c = find_cfg(v);
    NF4FLASH_CHECK(out_dtype != DType::F32 || c.f32_out, "NF4FLASH_Q4GEMM_CFG=", v,
                   " has no f32-output kernel (ws-n128s6 and w2n128s4 have)");
    return c;
  }
  if (out_dtype == DType::F32) return kCfgs[1];
  const int64_t sms = std::max(1, device_sms());
  const Cfg* best = nullptr;
  int64_t best_cost = 0;
  for (const auto& [idx, us] : {std::pair{0, 30}, std::pair{1, 36}, std::pair{2, 55}}) {
    const Cfg& c = kCfgs[idx];
    const int64_t blocks = rb * ((T + c.bn - 1) / c.bn);
    const int64_t cost = (blocks + sms - 1) / sms * us;
    if (!best || cost < best_cost || (cost == best_cost && c.bn > best->bn)) best = &c, best_cost = cost;
  }
  return *best;
}

// Split-K for one weight whose blocks leave SMs idle (few row blocks at few tokens: o and down
// projections at T <= 512): s splits multiply the blocks by s and divide each block's K by s, at
// the cost of writing s f32 partial tiles and one reduce pass (modelled at 3 TB/s). Taken only
// when the model predicts a 15% gain and the workspace holds s x T x rows floats;
// NF4FLASH_Q4GEMM_SPLITK=N forces N (1 = never).
struct Pick {
  const Cfg* cfg;
  int split;
};
Pick pick_split(int64_t T, DType out_dtype, int64_t rb, int64_t K, int64_t rows, int64_t ws_floats, DType act) {
  const Cfg& base = pick(T, out_dtype, rb);
  Pick best{&base, 1};
  const bool can = base.ws && out_dtype == act && ws_floats > 0;
  if (const char* v = std::getenv("NF4FLASH_Q4GEMM_SPLITK"); v && *v) {
    const int s = std::max(1, std::atoi(v));
    if (s > 1) {
      NF4FLASH_CHECK(can && int64_t(s) * T * rows <= ws_floats, "NF4FLASH_Q4GEMM_SPLITK=", s,
                     ": split-K needs a ws-* configuration, 16-bit output and a workspace of ", int64_t(s) * T * rows,
                     " floats (have ", ws_floats, ")");
      best.split = s;
    }
    return best;
  }
  if (!can || std::getenv("NF4FLASH_Q4GEMM_CFG")) return best;
  const double sms = std::max(1, device_sms());
  auto cost = [&](const Cfg& c, int s, double us) {
    const double blocks = double(rb) * double((T + c.bn - 1) / c.bn) * s;
    const double reduce = s > 1 ? (double(s) * T * rows * 4 + double(T) * rows * 2) / 3.0e6 : 0.0;
    return std::ceil(blocks / sms) * us * double(K) / 4096.0 / s + reduce;
  };
  const double us_of[3] = {30, 36, 55};
  const double c1 = cost(base, 1, us_of[&base - kCfgs]);
  double best_cost = 0.85 * c1;
  for (int s : {2, 4})
    for (int idx = 0; idx < 3; ++idx) {
      if (int64_t(s) * T * rows > ws_floats || (K / 64) < 2 * s) continue;
      const double c = cost(kCfgs[idx], s, us_of[idx]);
      if (c < best_cost) best = {&kCfgs[idx], s}, best_cost = c;
    }
  return best;
}

template <typename TO>
__global__ void splitk_reduce_kernel(const float* __restrict__ part, int ksplit, int64_t n, int64_t rows,
                                     const float* __restrict__ bias, TO* __restrict__ out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.f;
    for (int z = 0; z < ksplit; ++z) s += part[z * n + i];  // fixed order: deterministic
    if (bias) s += bias[i % rows];
    out[i] = from_f32<TO>(s);
  }
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

// The cp.async kernel: blocks of 8 row tiles x BN tokens.
template <auto Kernel>
dim3 prepare(int smem, int64_t RT, int64_t T, int bn) {
  smem_opt_in<Kernel>(smem);
  const int64_t gx = (RT + 7) / 8, gy = (T + bn - 1) / bn;
  NF4FLASH_CHECK(gx <= 0x7fffffff && gy <= 65535, "gemm_q4_wgmma: grid ", gx, " x ", gy, " too large");
  return dim3(unsigned(gx), unsigned(gy));
}

template <typename TA, typename TO, bool DQ, int BN, int S>
void launch_sync(const Q4GemmKArgs& k, cudaStream_t st) {
  constexpr auto kernel = gemm_q4_wgmma_kernel<TA, TO, DQ, 2, BN, S>;
  constexpr int smem = q4g_smem_bytes(2, BN, S);
  kernel<<<prepare<kernel>(smem, k.w.RT, k.T, BN), dim3(256), smem, st>>>(k);
  CUDA_CHECK_LAUNCH();
}

// One launch over the weights of m (1-3; SWIGLU: gate and up): x [T, cols] as a 2D tensor map
// (boxes of BN rows x 64 columns, 128-byte swizzle); each weight's codes as [RT, KT * 128 u32]
// (boxes of one 512-byte column tile x 8 row tiles, 4 for SWIGLU) and absmax as [RT, KT * 16] f32
// or u8 (boxes of 16 x 8 or 4).
template <typename TA, typename TO, bool DQ, int BN, int S, bool SWIGLU>
void launch_ws(const GemmQ4MultiArgs& m, cudaStream_t st, int ksplit = 1, float* partial = nullptr) {
  constexpr auto kernel = gemm_q4_ws_kernel<TA, TO, DQ, BN, S, SWIGLU>;
  constexpr int smem = q4g_ws_smem_bytes(BN, S);
  constexpr uint32_t rtw = SWIGLU ? 4 : 8;
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
    if (!SWIGLU || i == 0) blocks += (w.RT + rtw - 1) / rtw;
    NF4FLASH_CHECK(blocks <= 0x7fffffff, "gemm_q4_wgmma: too many row blocks");
    p.blk_end[i] = int(blocks);
  }
  p.nseg = m.nseg;
  p.T = int(m.T);
  const int KT = int(w0.KT);
  p.kps = (KT + ksplit - 1) / ksplit;
  p.ksplit = (KT + p.kps - 1) / p.kps;  // every split gets >= 1 column tile
  p.partial = partial;
  NF4FLASH_CHECK(p.ksplit == 1 || (partial && m.nseg == 1 && !SWIGLU), "gemm_q4_wgmma: split-K takes one weight and a workspace");
  smem_opt_in<kernel>(smem);
  const int64_t gy = (m.T + BN - 1) / BN;
  p.raster_rows = raster_rows() && blocks <= 65535;
  NF4FLASH_CHECK(gy <= (p.raster_rows ? 0x7fffffff : 65535), "gemm_q4_wgmma: grid ", blocks, " x ", gy, " too large");
  const dim3 grid = p.raster_rows ? dim3(unsigned(gy), unsigned(blocks), unsigned(p.ksplit))
                                  : dim3(unsigned(blocks), unsigned(gy), unsigned(p.ksplit));
  kernel<<<grid, dim3(kQ4gWsThreads), smem, st>>>(p);
  CUDA_CHECK_LAUNCH();
  if (p.ksplit > 1) {
    const int64_t n = m.T * w0.rows;
    const int rblocks = int(std::min<int64_t>((n + 255) / 256, int64_t(device_sms()) * 8));
    splitk_reduce_kernel<TO><<<rblocks, 256, 0, st>>>(partial, p.ksplit, n, w0.rows, m.bias[0], static_cast<TO*>(m.out[0]));
    CUDA_CHECK_LAUNCH();
  }
}

template <typename TA, typename TO, bool DQ, int BN, int S>
void launch_ws(const Q4GemmKArgs& k, cudaStream_t st, int ksplit = 1, float* partial = nullptr) {
  GemmQ4MultiArgs m;
  m.w[0] = &k.w;
  m.bias[0] = k.bias;
  m.out[0] = k.out;
  m.x = k.x;
  m.T = k.T;
  launch_ws<TA, TO, DQ, BN, S, false>(m, st, ksplit, partial);
}

template <typename TA, typename TO, bool DQ>
void launch_cfg(const Cfg& c, const Q4GemmKArgs& k, cudaStream_t st, int ksplit, float* partial) {
  if constexpr (std::is_same_v<TO, float>) {  // the n128 configurations only
    if (c.ws) launch_ws<TA, TO, DQ, 128, 6>(k, st);
    else launch_sync<TA, TO, DQ, 128, 4>(k, st);
  } else if (c.ws) {
    if (c.bn == 64) launch_ws<TA, TO, DQ, 64, 8>(k, st, ksplit, partial);
    else if (c.bn == 128) launch_ws<TA, TO, DQ, 128, 6>(k, st, ksplit, partial);
    else launch_ws<TA, TO, DQ, 256, 4>(k, st, ksplit, partial);
  } else {
    if (c.bn == 64) launch_sync<TA, TO, DQ, 64, 4>(k, st);
    else if (c.bn == 128) launch_sync<TA, TO, DQ, 128, 4>(k, st);
    else launch_sync<TA, TO, DQ, 256, 4>(k, st);
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

std::string gemm_q4_wgmma_cfg(int64_t T, DType out_dtype, int64_t row_blocks) {
  return pick(T, out_dtype, row_blocks).name;
}
bool gemm_q4_wgmma_multi_ok(int64_t T, int64_t row_blocks) { return pick(T, DType::BF16, row_blocks).ws; }
const char* const* gemm_q4_wgmma_cfgs() {
  static const auto names = [] {
    std::array<const char*, kNumCfgs + 1> n{};
    for (int i = 0; i < kNumCfgs; ++i) n[size_t(i)] = kCfgs[i].name;
    return n;  // null-terminated
  }();
  return names.data();
}

void gemm_q4_wgmma(const GemmQ4Args& g, cudaStream_t st) {
  const Q4Device& w = *g.w;
  check_launch(g.T, w);
  NF4FLASH_CHECK(g.out_dtype == g.act || g.out_dtype == DType::F32, "gemm_q4_wgmma: output dtype ",
                 dtype_name(g.out_dtype));
  const Q4GemmKArgs k{w, g.x, int(g.T), g.bias, g.out};
  const Pick pk = pick_split(g.T, g.out_dtype, (w.RT + 7) / 8, w.cols, w.rows, g.splitk_ws ? g.splitk_ws_floats : 0, g.act);
  const Cfg& c = *pk.cfg;
  auto go = [&](auto ta) {
    using TA = decltype(ta);
    if (g.out_dtype == DType::F32) {
      if (w.double_quant) launch_cfg<TA, float, true>(c, k, st, 1, nullptr);
      else launch_cfg<TA, float, false>(c, k, st, 1, nullptr);
    } else {
      if (w.double_quant) launch_cfg<TA, TA, true>(c, k, st, pk.split, g.splitk_ws);
      else launch_cfg<TA, TA, false>(c, k, st, pk.split, g.splitk_ws);
    }
  };
  if (g.act == DType::BF16) go(__nv_bfloat16{});
  else if (g.act == DType::F16) go(__half{});
  else fail("gemm_q4_wgmma: compute dtype ", dtype_name(g.act), " not supported (bf16/f16)");
}

void gemm_q4_wgmma_multi(const GemmQ4MultiArgs& m, cudaStream_t st) {
  NF4FLASH_CHECK(m.nseg >= 1 && m.nseg <= kQ4gMaxSegs && (!m.swiglu || m.nseg == 2), "gemm_q4_wgmma_multi: ",
                 m.nseg, " weights", m.swiglu ? " (SwiGLU takes gate and up)" : "");
  const Q4Device& w0 = *m.w[0];
  check_launch(m.T, w0);
  int64_t rb = 0;
  for (int i = 0; i < m.nseg; ++i) {
    const Q4Device& w = *m.w[i];
    // (the nested code table is taken from weight 0: the caller checks the tables are equal)
    NF4FLASH_CHECK(w.cols == w0.cols && w.double_quant == w0.double_quant && std::equal(w.code, w.code + 16, w0.code),
                   "gemm_q4_wgmma_multi: weight ", i, " differs from weight 0 in cols or quantization parameters");
    NF4FLASH_CHECK(!m.swiglu || w.rows == w0.rows, "gemm_q4_wgmma_multi: gate and up rows differ");
    rb += (w.RT + 7) / 8;
  }
  const Cfg& c = pick(m.T, m.act, rb);
  NF4FLASH_CHECK(c.ws, "gemm_q4_wgmma_multi: configuration ", c.name, " is not warp-specialized (ws-*)");
  auto go = [&](auto ta) {
    using TA = decltype(ta);
    auto run = [&](auto dq) {
      constexpr bool DQ = decltype(dq)::value;
      auto bn = [&](auto sw) {
        constexpr bool SW = decltype(sw)::value;
        if (c.bn == 64) launch_ws<TA, TA, DQ, 64, 8, SW>(m, st);
        else if (c.bn == 128) launch_ws<TA, TA, DQ, 128, 6, SW>(m, st);
        else launch_ws<TA, TA, DQ, 256, 4, SW>(m, st);
      };
      if (m.swiglu) bn(std::true_type{});
      else bn(std::false_type{});
    };
    if (w0.double_quant) run(std::true_type{});
    else run(std::false_type{});
  };
  if (m.act == DType::BF16) go(__nv_bfloat16{});
  else if (m.act == DType::F16) go(__half{});
  else fail("gemm_q4_wgmma: compute dtype ", dtype_name(m.act), " not supported (bf16/f16)");
}

}  // namespace nf4flash::cuda
