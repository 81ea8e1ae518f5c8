// Launchers of the GEMV kernels (4-bit fused and dense) and of the 4-bit repack/dequantize kernels.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "backend/cuda/kernels/gemv_dense.cuh"
#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/kernels/gemv_q4_ring.cuh"
#include "backend/cuda/kernels/gemv_q4_seq.cuh"
#include "backend/cuda/kernels/gemv_q4_stream.cuh"

namespace nf4flash::cuda {

namespace {
int num_sms() {
  static int n = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

int device_cc_major() {
  static int m = [] {
    int dev = 0, v = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, dev));
    return v;
  }();
  return m;
}

// Warps per block of the stream kernel (NF4FLASH_GEMV_WARPS=8|16; kernel-bench compares them).
int stream_warps() {
  const char* v = std::getenv("NF4FLASH_GEMV_WARPS");
  return v && std::string_view(v) == "16" ? 16 : 8;
}

// Feed of the stream kernel: "regs" (default: register prefetch, 2 blocks/SM) or "bulk"
// (cp.async.bulk ring, 1 block/SM; NF4FLASH_GEMV_FEED=bulk).
bool stream_bulk() {
  const char* v = std::getenv("NF4FLASH_GEMV_FEED");
  return v && std::string_view(v) == "bulk";
}

int stream_grid(bool bulk) { return bulk ? num_sms() : 2 * num_sms(); }

// Dynamic shared memory the stream kernel may take (ring + table + staged x): the opt-in limit
// less the static arrays and a margin.
int stream_smem_limit() {
  static int v = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return optin - 24 * 1024;
  }();
  return v;
}

template <typename TA, bool DQ, int W, bool BULK>
void launch_stream(Q4StreamKArgs& k, cudaStream_t st) {
  auto kernel = gemv_q4_stream_kernel<TA, DQ, W, BULK>;
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, stream_smem_limit()));
    attr_set = true;
  }
  // x in shared memory when it fits (decode: always; T = 8 x 14336 columns: not)
  k.stages = BULK ? kQsStages : 0;
  k.nocompute = 0;
  if (const char* v = std::getenv("NF4FLASH_GEMV_STAGES"); v && BULK) k.stages = std::clamp(std::atoi(v), 2, kQsMaxStages);
  // two blocks per SM without the ring: half the shared memory each
  const int limit = BULK ? stream_smem_limit() : stream_smem_limit() / 2 - 8 * 1024;
  if (const char* v = std::getenv("NF4FLASH_GEMV_NOCOMPUTE")) k.nocompute = std::atoi(v) != 0;
  const int64_t xb = int64_t(k.T) * qs_x_stride(k.cols);
  k.x_stride = qs_dyn_smem<DQ>(k.stages) + xb <= limit ? qs_x_stride(k.cols) : 0;
  const int dyn = qs_dyn_smem<DQ>(k.stages) + (k.x_stride ? int(xb) : 0);
  NF4FLASH_CHECK(dyn <= stream_smem_limit(), "gemv_q4_multi: ", k.stages, " stages need ", dyn, " bytes of shared memory");
  // every block must own >= 1 tile (the stream-K fix-up counts the blocks between two tiles)
  const int grid = int(std::min<int64_t>(stream_grid(BULK), k.N));
  launch_k(kernel, dim3(grid), dim3(W * 32), size_t(dyn), st, k);
  CUDA_CHECK_LAUNCH();
}

// 4-bit GEMV configurations: the register-prefetch kernel (gemv_q4_kernel: warps, tiles per batch,
// blocks/SM for the register cap, table addressing) and the cp.async ring kernel
// (gemv_q4_ring_kernel: warps, ring stages, tiles per batch, addressing). NF4FLASH_GEMV_CFG names
// one for measurements (kernel-bench sweeps them all; gpu tests run each); NF4FLASH_GEMV_Q4=regs3
// is w8u4m3a0.
struct Q4Cfg {
  const char* name;
  int warps, smem_bytes;
  const void* kernel;
};

template <typename TA, bool DQ, int M, int W, int U, int A>
Q4Cfg q4_cfg(const char* name) {
  return {name, W, q4_lut_bytes(A), reinterpret_cast<const void*>(gemv_q4_kernel<TA, DQ, M, W, U, A>)};
}
template <typename TA, bool DQ, int W, int U, int S, int A, int M>
Q4Cfg q4_ring_cfg(const char* name) {
  return {name, W, q4_lut_bytes(A) + q4_ring_bytes(W, S, U, DQ),
          reinterpret_cast<const void*>(gemv_q4_ring_kernel<TA, DQ, W, U, S, A, M>)};
}

template <typename TA, bool DQ>
const std::vector<Q4Cfg>& q4_cfgs() {
  static const std::vector<Q4Cfg> v = [] {
    // the set measured in kernel-bench (2026-12-02, docs/performance.md); configurations that
    // measured clearly slower there (w8u2m3a2, w8u8m1a2, rings of 4 warps or 2x4 / 2x6 tiles) removed
    std::vector<Q4Cfg> c = {q4_cfg<TA, DQ, 1, 8, 4, 0>("w8u4m1a0"),  q4_cfg<TA, DQ, 1, 8, 4, 1>("w8u4m1a1"),
                            q4_cfg<TA, DQ, 1, 8, 4, 2>("w8u4m1a2"),  q4_cfg<TA, DQ, 2, 16, 2, 2>("w16u2m2a2"),
                            q4_cfg<TA, DQ, 3, 8, 4, 0>("w8u4m3a0"),
                            q4_ring_cfg<TA, DQ, 8, 4, 3, 1, 1>("ring-w8s3u4a1"),
                            q4_ring_cfg<TA, DQ, 16, 2, 3, 1, 1>("ring-w16s3u2a1")};
    for (const Q4Cfg& k : c)
      CUDA_CHECK(cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, k.smem_bytes));
    return c;
  }();
  return v;
}

const char* q4_cfg_name() {
  const char* ev = std::getenv("NF4FLASH_GEMV_Q4");
  if (ev && std::string_view(ev) == "regs3") return "w8u4m3a0";
  const char* c = std::getenv("NF4FLASH_GEMV_CFG");
  return c && *c ? c : kQ4DefaultCfg;
}

template <typename TA, bool DQ>
void launch_q4(const GemvQ4Args& g, cudaStream_t st) {
  Q4KernelArgs a{*g.w, g.x, g.T, g.bias, g.out, g.out_dtype == DType::F32};
  const std::vector<Q4Cfg>& cfgs = q4_cfgs<TA, DQ>();
  const std::string_view want = q4_cfg_name();
  const Q4Cfg* k = nullptr;
  for (const Q4Cfg& c : cfgs)
    if (want == c.name) k = &c;
  NF4FLASH_CHECK(k, "NF4FLASH_GEMV_CFG=", want, ": no such GEMV configuration");
  static std::vector<int> per_sm;  // blocks per SM of each configuration (occupancy query, once)
  if (per_sm.empty()) per_sm.assign(cfgs.size(), 0);
  int& ps = per_sm[size_t(k - cfgs.data())];
  if (ps == 0) {
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ps, k->kernel, k->warps * 32, k->smem_bytes));
    ps = std::max(ps, 1);
  }
  const int grid = g.grid > 0 ? g.grid : int(std::min<int64_t>(g.w->RT, int64_t(ps) * num_sms()));
  void* args[] = {&a};
  launch_k_ptr(k->kernel, dim3(unsigned(grid)), dim3(unsigned(k->warps * 32)), size_t(k->smem_bytes), st, args);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

// One thread per output word of the tiled layout (kernels/gemv_q4.cuh, header comment).
__global__ void q4_repack_kernel(const uint8_t* __restrict__ packed, int64_t rows, int64_t cols,
                                 int64_t KT, int64_t n_words, uint32_t* __restrict__ tiles) {
  const int64_t wi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (wi >= n_words) return;
  const int64_t tile = wi >> 7;
  const int lane = int(wi >> 2) & 31, j = int(wi & 3);
  const int64_t rt = tile / KT, kt = tile % KT;
  const int g = lane >> 2, t = lane & 3;
  const int64_t r0 = rt * 16 + g, r1 = r0 + 8, c0 = kt * 32 + 8 * t + 2 * j, rb = cols / 2;
  auto src = [&](int64_t r, int64_t c) -> uint32_t { return r < rows ? packed[r * rb + c] : 0u; };
  tiles[wi] = src(r0, c0) | (src(r1, c0) << 8) | (src(r0, c0 + 1) << 16) | (src(r1, c0 + 1) << 24);
}

// One thread per 16-byte word of dst (records of `words` 16-byte words per tile: codes 32, absmax
// 1 (u8) or 4 (f32)): group record (g, rt, j) <- record (rt, g*G + j) of the [RT][KT] order.
__global__ void q4_group_tiles_kernel(const uint4* __restrict__ src, int64_t RT, int64_t KT, int G, int words,
                                      int64_t n16, uint4* __restrict__ dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n16) return;
  const int64_t rec = i / words, word = i % words;
  const int64_t j = rec % G, rt = (rec / G) % RT, grp = rec / (G * RT);
  dst[i] = src[(rt * KT + grp * G + j) * words + word];
}

void q4_group_tiles(const uint8_t* src_dev, int64_t RT, int64_t KT, int G, int rec_bytes, uint8_t* dst_dev,
                    cudaStream_t st) {
  NF4FLASH_CHECK(G > 0 && KT % G == 0 && rec_bytes > 0 && rec_bytes % 16 == 0, "q4_group_tiles: ", KT,
                 " column tiles in groups of ", G, ", records of ", rec_bytes, " bytes");
  const int words = rec_bytes / 16;
  const int64_t n16 = RT * KT * words;
  q4_group_tiles_kernel<<<static_cast<unsigned>((n16 + 255) / 256), 256, 0, st>>>(
      reinterpret_cast<const uint4*>(src_dev), RT, KT, G, words, n16, reinterpret_cast<uint4*>(dst_dev));
  CUDA_CHECK_LAUNCH();
}

void q4_require_tile16x64(const Q4Device& w, const char* who) {
  NF4FLASH_CHECK(w.tile_group == 0, who, ": this weight's 4-bit tiles are in groups of ", w.tile_group,
                 " (kernel-bench's layout experiment), which only the lean decode GEMV at T = 1 reads");
}

void q4_repack(const uint8_t* packed_dev, int64_t rows, int64_t cols, uint8_t* tiles_dev, cudaStream_t st) {
  const int64_t RT = (rows + 15) / 16, KT = cols / 64, n_words = RT * KT * 128;
  const int threads = 256;
  q4_repack_kernel<<<static_cast<unsigned>((n_words + threads - 1) / threads), threads, 0, st>>>(
      packed_dev, rows, cols, KT, n_words, reinterpret_cast<uint32_t*>(tiles_dev));
  CUDA_CHECK_LAUNCH();
}

void gemv_q4(const GemvQ4Args& g, cudaStream_t st) {
  NF4FLASH_CHECK(g.T >= 1 && g.T <= kGemvMaxRows, "gemv_q4: T=", g.T, " outside 1..", kGemvMaxRows);
  q4_require_tile16x64(*g.w, "gemv_q4");
  if (g.act == DType::BF16) {
    if (g.w->double_quant) launch_q4<__nv_bfloat16, true>(g, st);
    else launch_q4<__nv_bfloat16, false>(g, st);
  } else if (g.act == DType::F16) {
    if (g.w->double_quant) launch_q4<__half, true>(g, st);
    else launch_q4<__half, false>(g, st);
  } else {
    fail("gemv_q4: compute dtype ", dtype_name(g.act), " not supported by the fused 4-bit GEMV (bf16/f16)");
  }
}

bool gemv_q4_stream_supported() { return device_cc_major() >= 9; }

// NF4FLASH_GEMV_Q4: unset/"auto"/"seq" = the in-order kernel (gemv_q4_seq) for every decode GEMV,
// lone or fused; "streamk" = the stream-K kernel for the fused launches and the register kernel
// for lone GEMVs (the default before the in-order kernel); "stream" = stream-K everywhere;
// "regs" / "regs3" = the register GEMV of NF4FLASH_GEMV_CFG (or w8u4m3a0), nothing fused.
namespace {
std::string_view gemv_q4_mode() {
  const char* v = std::getenv("NF4FLASH_GEMV_Q4");
  return v && *v ? std::string_view(v) : std::string_view("auto");
}
}  // namespace

bool gemv_q4_seq_enabled() {
  const std::string_view m = gemv_q4_mode();
  return m == "auto" || m == "seq";
}

bool gemv_q4_stream_enabled() {
  const std::string_view m = gemv_q4_mode();
  return (m == "stream" || m == "streamk") && gemv_q4_stream_supported();
}

bool gemv_q4_stream_all() { return gemv_q4_mode() == "stream" && gemv_q4_stream_supported(); }

int64_t gemv_q4_stream_partials_floats() { return int64_t(std::max(stream_grid(true), stream_grid(false))) * 2 * 256; }

// The fields the stream-K and in-order kernels share (segments, units, quantization
// parameters, epilogue), checked: every segment like segment 0; SwiGLU = gate and up of equal rows.
template <typename K>
void fill_multi_args(const GemvQ4MultiArgs& g, K& k, const char* who) {
  NF4FLASH_CHECK(g.T >= 1 && g.T <= kGemvMaxRows, who, ": T=", g.T, " outside 1..", kGemvMaxRows);
  NF4FLASH_CHECK(g.nseg >= 1 && g.nseg <= kQsMaxSegs, who, ": ", g.nseg, " segments");
  const Q4Device& w0 = *g.w[0];
  for (int i = 0; i < 16; ++i) k.code[i] = w0.code[i];
  k.nested_code = w0.nested_code;
  k.cols = w0.cols;
  k.KT = w0.KT;
  k.log2_blocksize = w0.log2_blocksize;
  k.log2_nested = w0.log2_nested;
  k.nseg = g.nseg;
  k.T = g.T;
  k.ep = int(g.ep);
  k.x = g.x;
  k.out_f32 = g.out_dtype == DType::F32;
  NF4FLASH_CHECK(!k.out_f32 || g.ep == GemvEpilogue::Store, who, ": f32 output only with a plain store");
  NF4FLASH_CHECK(g.ep != GemvEpilogue::SwiGLU || g.nseg == 2, who, ": SwiGLU takes gate and up");
  NF4FLASH_CHECK(g.ep != GemvEpilogue::Residual || g.nseg == 1, who, ": residual takes one weight");
  int64_t units = 0;
  for (int s = 0; s < g.nseg; ++s) {
    const Q4Device& w = *g.w[s];
    NF4FLASH_CHECK(w.cols == w0.cols && w.double_quant == w0.double_quant && w.log2_blocksize == w0.log2_blocksize &&
                       w.log2_nested == w0.log2_nested && std::equal(w.code, w.code + 16, w0.code) &&
                       w.tile_group == w0.tile_group,
                   who, ": segment ", s, " differs in shape or quantization from segment 0");
    Q4StreamSeg& q = k.seg[s];
    q.tiles = w.tiles;
    q.absmax = w.double_quant ? static_cast<const void*>(w.absq_tiled) : static_cast<const void*>(w.absmax_tiled);
    q.nested_absmax = w.nested_absmax;
    q.offset = w.offset;
    q.bias = g.bias[s];
    q.out = g.out[s];
    q.rows = w.rows;
    q.RT = w.RT;
    units += w.RT;
    k.unit_end[s] = units;
  }
  if (g.ep == GemvEpilogue::SwiGLU) {
    NF4FLASH_CHECK(g.w[1]->rows == w0.rows, who, ": gate and up differ in rows");
    k.nsub = 2;
    units = w0.RT;
  } else {
    k.nsub = 1;
  }
  k.units = units;
}

void gemv_q4_multi(const GemvQ4MultiArgs& g, cudaStream_t st) {
  NF4FLASH_CHECK(gemv_q4_stream_enabled(), "gemv_q4_multi: the stream kernel needs sm_90");
  q4_require_tile16x64(*g.w[0], "gemv_q4_multi");
  Q4StreamKArgs k{};
  fill_multi_args(g, k, "gemv_q4_multi");
  const Q4Device& w0 = *g.w[0];
  const int64_t units = k.units;
  k.N = units * k.nsub * k.KT;
  NF4FLASH_CHECK(units <= g.counters_len, "gemv_q4_multi: ", units, " row tiles exceed the ", g.counters_len,
                 " stream-K counters");
  k.partials = g.partials;
  k.counters = g.counters;
  const bool w16 = stream_warps() == 16, bulk = stream_bulk();
  auto go = [&](auto ta) {
    using TA = decltype(ta);
    if (bulk) {
      if (w0.double_quant) w16 ? launch_stream<TA, true, 16, true>(k, st) : launch_stream<TA, true, 8, true>(k, st);
      else w16 ? launch_stream<TA, false, 16, true>(k, st) : launch_stream<TA, false, 8, true>(k, st);
    } else {
      if (w0.double_quant) launch_stream<TA, true, 8, false>(k, st);
      else launch_stream<TA, false, 8, false>(k, st);
    }
  };
  if (g.act == DType::BF16) go(__nv_bfloat16{});
  else if (g.act == DType::F16) go(__half{});
  else fail("gemv_q4_multi: compute dtype ", dtype_name(g.act), " not supported (bf16/f16)");
}

std::string_view gemv_q4_seq_cfg() {
  const char* v = std::getenv("NF4FLASH_GEMV_SEQ_CFG");
  return v && *v ? std::string_view(v) : std::string_view(kSeqDefaultCfg);
}

namespace {
// In-order GEMV configurations (warps, tiles per batch, batches in flight, blocks per SM);
// NF4FLASH_GEMV_SEQ_CFG names one (kernel-bench and the gpu tests run each).
template <typename TA, bool DQ, int W, int U, int D, int MINB>
void launch_seq_cfg(Q4SeqArgs& k, cudaStream_t st) {
  // the table, plus x when it fits beside it at MINB blocks per SM (decode: T = 1, all shapes here)
  constexpr int lut = q4_lut_bytes(2), x_max = 38 * 1024;
  auto kx = gemv_q4_seq_kernel<TA, DQ, true, W, U, D, MINB>;
  auto kg = gemv_q4_seq_kernel<TA, DQ, false, W, U, D, MINB>;
  static const std::array<int, 2> per_sm = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kx, cudaFuncAttributeMaxDynamicSharedMemorySize, lut + x_max));
    CUDA_CHECK(cudaFuncSetAttribute(kg, cudaFuncAttributeMaxDynamicSharedMemorySize, lut));
    int v0 = 0, v1 = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v0, kg, W * 32, lut));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v1, kx, W * 32, lut + x_max));
    return std::array<int, 2>{std::max(v0, 1), std::max(v1, 1)};
  }();
  const int64_t xb = int64_t(k.T) * seq_x_stride(k.cols);
  const char* env = std::getenv("NF4FLASH_GEMV_X_SMEM");  // "0": x from global (comparison)
  k.x_stride = xb <= x_max && !(env && std::atoi(env) == 0) ? seq_x_stride(k.cols) : 0;
  const int smem = lut + (k.x_stride ? int(xb) : 0);
  const int grid = int(std::min<int64_t>(k.units, int64_t(per_sm[k.x_stride ? 1 : 0]) * num_sms()));
  launch_k(k.x_stride ? kx : kg, dim3(unsigned(grid)), dim3(W * 32), size_t(smem), st, k);
  CUDA_CHECK_LAUNCH();
}

template <typename TA, bool DQ>
void launch_seq(Q4SeqArgs& k, cudaStream_t st) {
  if (k.tile_group) return gemv_q4_lean_grouped(k, std::is_same_v<TA, __nv_bfloat16>, DQ, st);
  if (k.ablate) return gemv_q4_lean_ablated(k, std::is_same_v<TA, __nv_bfloat16>, DQ, st);
  std::string_view c = gemv_q4_seq_cfg();
  if (gemv_q4_lean_warps(c) > 0) {  // the lean kernel (ops_gemv_lean.cu)
    if (gemv_q4_lean_applies(k) && gemv_q4_lean(k, c, std::is_same_v<TA, __nv_bfloat16>, DQ, st)) return;
    c = "w8u4d3";  // x does not fit in shared memory, or 32-bit offsets would overflow
  }
  NF4FLASH_CHECK(!k.norm_w, "gemv_q4_seq: a fused rms_norm needs the lean kernel (gemv_q4_norm_fusable)");
  if (c == "w8u2d4") launch_seq_cfg<TA, DQ, 8, 2, 4, 2>(k, st);
  else if (c == "w8u4d3") launch_seq_cfg<TA, DQ, 8, 4, 3, 2>(k, st);
  else if (c == "w16u2d2") launch_seq_cfg<TA, DQ, 16, 2, 2, 2>(k, st);
  else if (c == "w16u2d4m1") launch_seq_cfg<TA, DQ, 16, 2, 4, 1>(k, st);
  else if (c == "w16u4d3m1") launch_seq_cfg<TA, DQ, 16, 4, 3, 1>(k, st);
  else fail("NF4FLASH_GEMV_SEQ_CFG=", c, ": no such configuration (", kSeqCfgNames, ")");
}
}  // namespace

int gemv_num_sms() { return num_sms(); }

void gemv_q4_seq(const GemvQ4MultiArgs& g, cudaStream_t st) {
  Q4SeqArgs k{};
  fill_multi_args(g, k, "gemv_q4_seq");
  k.tile_group = g.w[0]->tile_group;
  k.ablate = g.ablate;
  k.pf = g.l2pf;
  k.sk_slots = g.sk_slots;
  k.sk_cap = g.sk_cap;
  if (g.norm_w) {
    NF4FLASH_CHECK(gemv_q4_norm_fusable(g.T, k.cols), "gemv_q4_seq: rms_norm cannot be fused here (T=", g.T,
                   ", cols=", k.cols, ", configuration ", gemv_q4_seq_cfg(), ")");
    k.norm_w = g.norm_w;
    k.norm_eps = g.norm_eps;
  }
  const Q4Device& w0 = *g.w[0];
  if (g.act == DType::BF16) {
    if (w0.double_quant) launch_seq<__nv_bfloat16, true>(k, st);
    else launch_seq<__nv_bfloat16, false>(k, st);
  } else if (g.act == DType::F16) {
    if (w0.double_quant) launch_seq<__half, true>(k, st);
    else launch_seq<__half, false>(k, st);
  } else {
    fail("gemv_q4_seq: compute dtype ", dtype_name(g.act), " not supported (bf16/f16)");
  }
}

bool gemv_q4_chain(const GemvQ4MultiArgs* st, int n, unsigned* counters, cudaStream_t s, bool launch) {
  if (n < 2 || n > kGemvChainMaxStages || !gemv_q4_seq_enabled() || st[0].act == DType::F32) return false;
  Q4SeqArgs k[kGemvChainMaxStages] = {};
  const Q4Device& w0 = *st[0].w[0];
  for (int i = 0; i < n; ++i) {
    const GemvQ4MultiArgs& g = st[i];
    const Q4Device& w = *g.w[0];
    if (g.act != st[0].act || w.double_quant != w0.double_quant || !std::equal(w.code, w.code + 16, w0.code))
      return false;
    if (w.tile_group || g.ablate) return false;  // the grouped layout, ablations: one launch per stage
    fill_multi_args(g, k[i], "gemv_q4_chain");
    if (g.norm_w) {
      if (!gemv_q4_norm_fusable(g.T, k[i].cols)) return false;
      k[i].norm_w = g.norm_w;
      k[i].norm_eps = g.norm_eps;
    }
  }
  return gemv_q4_lean_chain(k, n, counters, st[0].act == DType::BF16, w0.double_quant, s, launch);
}

void q4_dequant(const Q4Device& w, void* out, DType dtype, cudaStream_t st, int64_t row0, int64_t nrows) {
  q4_require_tile16x64(w, "q4_dequant");
  if (nrows < 0) nrows = w.rows - row0;
  NF4FLASH_CHECK(row0 >= 0 && row0 + nrows <= w.rows, "q4_dequant: rows [", row0, ", ", row0 + nrows,
                 ") out of range (", w.rows, ")");
  // the 8-column kernel (16-byte stores); the 2-column one remains for NF4FLASH_Q4_DEQUANT=v1
  const char* v = std::getenv("NF4FLASH_Q4_DEQUANT");
  const bool v1 = v && std::string_view(v) == "v1";
  NF4FLASH_CHECK(!v1 || (row0 == 0 && nrows == w.rows), "NF4FLASH_Q4_DEQUANT=v1 dequantizes whole matrices only");
  const int64_t n = v1 ? w.rows * (w.cols / 2) : nrows * (w.cols / 8);
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  NF4FLASH_DISPATCH_ACT(dtype, "q4_dequant", [&] {
    if (v1) {
      if (w.double_quant) q4_dequant_kernel<T, true><<<blocks, threads, 0, st>>>(w, static_cast<T*>(out));
      else q4_dequant_kernel<T, false><<<blocks, threads, 0, st>>>(w, static_cast<T*>(out));
    } else {
      if (w.double_quant) q4_dequant8_kernel<T, true><<<blocks, threads, 0, st>>>(w, row0, nrows, static_cast<T*>(out));
      else q4_dequant8_kernel<T, false><<<blocks, threads, 0, st>>>(w, row0, nrows, static_cast<T*>(out));
    }
    CUDA_CHECK_LAUNCH();
  });
}

namespace {
// Dense single-weight decode GEMV kernels (NF4FLASH_DENSE_STREAM: 0 or unset vec, 4 / 8 the
// stream kernel with 4 / 8 chunks per batch, k the row-split kernel). H200 (kernel-bench, bf16,
// T=1, % of copy): down 4096x14336 vec 81.4, split 86.7, stream4 79.9; o 4096x4096 vec 70.4,
// split 61.9; gate 14336x4096 vec 85.3, split 71.2. Splitting every weight (o, down, lm_head)
// measured slower end to end (bf16 decode @512 204 vs 213 tok/s), and so did splitting only
// down_proj, faster alone (thirteenth session: 206.5 vs 208.5 tok/s in one run; 204 vs 212
// across sessions): vec is the default for all.
enum class DenseKern { Vec, Stream4, Stream8, Split };
DenseKern dense_kernel(int64_t /*N*/, int64_t /*K*/) {
  const char* v = std::getenv("NF4FLASH_DENSE_STREAM");
  if (!v || !*v) return DenseKern::Vec;
  const std::string_view s(v);
  NF4FLASH_CHECK(s == "0" || s == "4" || s == "8" || s == "k", "NF4FLASH_DENSE_STREAM=", s, ": expected 0, 4, 8 or k");
  return s == "k" ? DenseKern::Split : s == "8" ? DenseKern::Stream8 : s == "4" ? DenseKern::Stream4 : DenseKern::Vec;
}

// Kern over `blocks` blocks of 256 threads, at most as many as are resident at once (each block
// then walks its rows back to back).
template <auto Kern>
void launch_resident(const DenseKernelArgs& a, int64_t blocks, cudaStream_t st) {
  static const int per_sm = [] {
    int v = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, Kern, 256, 0));
    return std::max(v, 1);
  }();
  launch_k(Kern, dim3(unsigned(std::min<int64_t>(blocks, int64_t(per_sm) * num_sms()))), dim3(256), 0, st, a);
}

template <typename TW, typename TA, int TN>
void launch_dense_kern(const DenseKernelArgs& a, DenseKern k, unsigned vec_grid, cudaStream_t st) {
  switch (k) {
    case DenseKern::Split: return launch_resident<gemv_dense_split_kernel<TW, TA, TN>>(a, a.N, st);
    case DenseKern::Stream4: return launch_resident<gemv_dense_stream_kernel<TW, TA, TN, 4>>(a, (a.N + 7) / 8, st);
    case DenseKern::Stream8: return launch_resident<gemv_dense_stream_kernel<TW, TA, TN, 8>>(a, (a.N + 7) / 8, st);
    case DenseKern::Vec: return launch_k(gemv_dense_vec_kernel<TW, TA, TN>, dim3(vec_grid), dim3(256), 0, st, a);
  }
}

template <typename TW, typename TA>
void launch_dense(const GemvDenseArgs& g, cudaStream_t st) {
  NF4FLASH_CHECK(!g.residual || g.out_dtype == g.act, "gemv_dense: the residual output is in the compute dtype");
  DenseKernelArgs a{g.w, g.N, g.K, g.x, g.T, g.bias, g.out, g.out_dtype == DType::F32, nullptr, g.residual ? 1 : 0};
  const int64_t want = (g.N + 7) / 8;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(want, int64_t(num_sms()) * 64));
  constexpr bool vec16 = sizeof(TW) == 2 && sizeof(TA) == 2;
  const bool aligned = (g.K % 8 == 0) && (reinterpret_cast<uintptr_t>(g.w) % 16 == 0) &&
                       (reinterpret_cast<uintptr_t>(g.x) % 16 == 0);
  if (vec16 && aligned) {
    // the L2 prefetch (NF4FLASH_L2_PREFETCH_MB) rides on the vec kernel only
    const DenseKern k = g.l2pf ? DenseKern::Vec : dense_kernel(g.N, g.K);
    a.pf = g.l2pf;
    if (g.T == 1) launch_dense_kern<TW, TA, 1>(a, k, grid, st);
    else launch_dense_kern<TW, TA, kGemvMaxRows>(a, k, grid, st);
  } else {
    launch_k(gemv_dense_scalar_kernel<TW, TA>, dim3(grid), dim3(256), 0, st, a);
  }
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void gemv_dense(const GemvDenseArgs& g, cudaStream_t st) {
  NF4FLASH_CHECK(g.T >= 1 && g.T <= kGemvMaxRows, "gemv_dense: T=", g.T, " outside 1..", kGemvMaxRows);
  NF4FLASH_DISPATCH_ACT(g.act, "gemv_dense (activations)", [&] {
    using TA = T;
    NF4FLASH_DISPATCH_ACT(g.w_dtype, "gemv_dense (weight)", [&] { launch_dense<T, TA>(g, st); });
  });
}

}  // namespace nf4flash::cuda
