// Launchers of the attention kernels (kernels/attention.cuh, kernels/attention_flash.cuh): one
// dispatch over (act dtype, cache dtype, head_dim); head_dim other than 64/128 is refused by name.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_combine.cuh"
#include "backend/cuda/kernels/attention_decode_mma.cuh"
#include "backend/cuda/kernels/attention_eager.cuh"
#include "backend/cuda/kernels/attention_flash.cuh"

namespace nf4flash::cuda {

namespace {
int decode_splits(const AttnArgs& a, int hchunks, bool mma) {
  const int per_split = a.n_kv * hchunks * a.T;
  // blocks of 4 warps: `waves` blocks per SM (NF4FLASH_DECODE_WAVES; default 4 for the CUDA-core
  // kernel, 3 for the tensor-core one: the blocks one SM holds, 64 KB of ring each)
  static const int env_waves = [] {
    const char* v = std::getenv("NF4FLASH_DECODE_WAVES");
    return v && *v ? std::clamp(std::atoi(v), 1, 32) : 0;
  }();
  const int waves = env_waves ? env_waves : (mma ? 3 : 4);
  // the CUDA-core kernel rounds up (its default fills 4 blocks per SM exactly for 8 kv heads); the
  // tensor-core one rounds down: its 3 blocks per SM must all be resident at once (H200, run 2 of
  // 2026-12-03: 50 splits x 8 = 400 blocks for 396 places left 4 blocks to a second wave)
  const int n = mma ? waves * a.num_sms / per_split : (waves * a.num_sms + per_split - 1) / per_split;
  return std::clamp(n, 1, kDecodeMaxSplits);
}

// Fewest cache positions per decode split (NF4FLASH_DECODE_MIN_CHUNK, 16..1024, default 16): fewer
// positions per block put more blocks on a short context (each block walks its slice in steps of
// 16 positions with one load round trip per step), at the price of more partials to merge, which
// the wide combine loads together. Only contexts under ~64 positions per split see it (L < 64 *
// nsplit, ~4200 on 132 SMs): longer ones split into slices of L / nsplit either way. H100,
// 2026-12-05 (kernel-bench decode attention ladder, wide combine, Llama-3-8B layer): 16 against 64
// positions 5.46 / 7.43 / 8.66 / 10.71 us against 6.97 / 8.17 / 9.96 / 12.89 at ctx 128 / 512 /
// 1024 / 2048. Read per call (kernel-bench switches it).
int decode_min_chunk() {
  const char* e = std::getenv("NF4FLASH_DECODE_MIN_CHUNK");
  if (!e || !*e) return 16;
  char* end = nullptr;
  const long c = std::strtol(e, &end, 10);
  NF4FLASH_CHECK(*end == 0 && c >= 16 && c <= 1024, "NF4FLASH_DECODE_MIN_CHUNK=", e, ": expected 16..1024");
  return int(c);
}

// K/V ring depth of the decode kernel (NF4FLASH_DECODE_RING: 0 = loads into registers, one
// iteration in flight, the kernel before 2026-12-03; 4 = the default). Read per call (tests and
// kernel-bench switch it).
int decode_ring() {
  const char* e = std::getenv("NF4FLASH_DECODE_RING");
  if (!e || !*e) return 4;
  const std::string_view v(e);
  NF4FLASH_CHECK(v == "0" || v == "4", "NF4FLASH_DECODE_RING=", v, ": expected 0 or 4");
  return v == "0" ? 0 : 4;
}

// Split order of the decode kernels (NF4FLASH_DECODE_ORDER, read per call): "contiguous" (default)
// = each split one slice of the context; "interleave" = the active splits take its block steps round
// robin (decode_span in kernels/attention.cuh). The fused rope form walks slices only.
bool decode_interleave() { return env_switch("NF4FLASH_DECODE_ORDER", "contiguous", "interleave"); }

template <typename F>
void dispatch_attn(const AttnArgs& a, const char* what, F&& f) {
  NF4FLASH_DISPATCH_ACT(a.act, what, [&] {
    using TA = T;
    NF4FLASH_DISPATCH_ACT(a.kv_dtype, what, [&] {
      using TK = T;
      if (a.head_dim == 64) f(TA{}, TK{}, std::integral_constant<int, 64>{});
      else if (a.head_dim == 128) f(TA{}, TK{}, std::integral_constant<int, 128>{});
      else fail(what, ": unsupported head_dim ", a.head_dim, " (supported: 64, 128)");
    });
  });
}
}  // namespace

// NF4FLASH_ATTN_COMBINE: unset/"kernel" = the separate combine launch; "fused" = the last split
// block of a head group merges the splits. H200, 2026-12-03 (llama3-8b NF4-dq, decode @512): the
// fused form measured slower, 366.8 vs 386.4 tok/s (ncu: decode attention 16.6 us per launch
// against 9.0 + 4.3 for the two launches; the last block merges its 4 heads one after the other
// and every block fences its partials), so it stays opt-in.
// "wide" (the default, unset) = the combine launch with every split's loads in flight together
// (kernels/attention_combine.cuh); "kernel" = attn_combine_kernel, the default before 2026-12-05.
// H100, 2026-12-05 (llama3-8b NF4-dq, decode, interleaved order beside it): wide 386.0 / 241.7
// tok/s at ctx 512 / 32768 against 378.6 / 229.9; kernel-bench ladder, split kernel + combine at
// ctx 32768: 58.5 against 66.0 us.
namespace {
enum class CombineMode { Kernel, Fused, Wide };
CombineMode attention_combine_mode() {
  const char* v = std::getenv("NF4FLASH_ATTN_COMBINE");
  if (!v || !*v || std::string_view(v) == "wide") return CombineMode::Wide;
  if (std::string_view(v) == "kernel") return CombineMode::Kernel;
  if (std::string_view(v) == "fused") return CombineMode::Fused;
  fail("NF4FLASH_ATTN_COMBINE=", v, ": expected wide, kernel or fused");
}
}  // namespace
bool attention_combine_fused() { return attention_combine_mode() == CombineMode::Fused; }

namespace {
// The separate combine launch after the split kernel: attn_combine_kernel, or the wide form.
template <typename TA, int HD>
void launch_combine(const AttnArgs& k, int nsplit, cudaStream_t st) {
  if (attention_combine_mode() == CombineMode::Wide)
    launch_k(attn_combine_wide_kernel<TA, HD>, dim3(k.n_heads, k.T), dim3(128), 0, st, k, nsplit, k.T);
  else
    launch_k(attn_combine_kernel<TA>, dim3(k.n_heads, k.T), dim3(HD), 0, st, k, nsplit, k.T);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

int64_t attention_decode_workspace_floats(int T, int n_heads, int head_dim) {
  return int64_t(T) * n_heads * kDecodeMaxSplits * (head_dim + 2);
}

// Which decode kernel runs (NF4FLASH_DECODE_KERNEL, read per call): "simt" (default, "auto") = the
// CUDA-core kernel (attention.cuh), every dtype and the opt-in fused combine
// (NF4FLASH_ATTN_COMBINE=fused); "mma" = the tensor-core kernel (attention_decode_mma.cuh), for a
// bf16 or f16 cache in the compute dtype. H200, 2026-12-03 (llama3-8b NF4, run 2): mma measured
// slower, 69.7 vs 62.6 us at ctx 32768 and 232.9 vs 240.7 tok/s decode @32768, so it is opt-in.
// mma where it cannot run is an error, never a fallback.
bool decode_use_mma(const AttnArgs& a) {
  const char* e = std::getenv("NF4FLASH_DECODE_KERNEL");
  const std::string_view v = e ? e : "";
  NF4FLASH_CHECK(v.empty() || v == "auto" || v == "mma" || v == "simt", "NF4FLASH_DECODE_KERNEL=", v,
                 ": expected auto, mma or simt");
  if (v != "mma") return false;
  const bool servable = a.act == a.kv_dtype && (a.act == DType::BF16 || a.act == DType::F16) && !attention_combine_fused();
  NF4FLASH_CHECK(servable, "NF4FLASH_DECODE_KERNEL=mma: needs a bf16 or f16 KV cache in the compute dtype "
                 "and the separate combine (cache ", dtype_name(a.kv_dtype), ", compute ", dtype_name(a.act), ")");
  return true;
}

template <typename T, int HD, bool R2>
void launch_decode_mma(const AttnArgs& k, dim3 grid, int nsplit, int hchunks, cudaStream_t st) {
  constexpr int smem = attn_decode_mma_smem<HD>();
  static const bool attr = [] {
    CUDA_CHECK(cudaFuncSetAttribute(attn_decode_mma_kernel<T, HD, R2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    return true;
  }();
  (void)attr;
  launch_k(attn_decode_mma_kernel<T, HD, R2>, grid, dim3(128), size_t(smem), st, k, nsplit, hchunks);
}

void attention_decode(const AttnArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(a.T >= 1 && a.T <= kDecodeMaxRows, "attention_decode: T=", a.T, " outside 1..", kDecodeMaxRows);
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  const int G = a.n_heads / a.n_kv;
  const bool mma = decode_use_mma(a);
  const int gh = mma ? (G > 8 ? 16 : 8) : kDecGT;  // q heads per block
  const int hchunks = (G + gh - 1) / gh;
  const int nsplit = decode_splits(a, hchunks, mma);
  NF4FLASH_CHECK(int64_t(a.T) * a.n_heads * nsplit * (a.head_dim + 2) <= a.workspace_floats,
                 "attention_decode: workspace too small");
  dispatch_attn(a, "attention (decode)", [&](auto ta, auto tk, auto hd) {
    using TA = decltype(ta);
    using TK = decltype(tk);
    constexpr int HD = decltype(hd)::value;
    dim3 grid(static_cast<unsigned>(a.n_kv * hchunks), static_cast<unsigned>(nsplit), static_cast<unsigned>(a.T));
    AttnArgs k = a;
    if (!attention_combine_fused()) k.counters = nullptr;
    k.dec_min_chunk = decode_min_chunk();
    k.dec_interleave = decode_interleave() ? 1 : 0;
    if constexpr (std::is_same_v<TA, TK> && !std::is_same_v<TA, float>) {
      if (mma) {
        if (G > 8) launch_decode_mma<TA, HD, true>(k, grid, nsplit, hchunks, st);
        else launch_decode_mma<TA, HD, false>(k, grid, nsplit, hchunks, st);
        CUDA_CHECK_LAUNCH();
        launch_combine<TA, HD>(k, nsplit, st);
        return;
      }
    }
    if (decode_ring() == 0) launch_k(attn_decode_kernel<TA, TK, HD, 0, false>, grid, dim3(128), 0, st, k, nsplit, hchunks);
    else launch_k(attn_decode_kernel<TA, TK, HD, 4, false>, grid, dim3(128), 0, st, k, nsplit, hchunks);
    CUDA_CHECK_LAUNCH();
    if (!k.counters) launch_combine<TA, HD>(k, nsplit, st);
  });
}

// NF4FLASH_DECODE_FUSED: "1" = attention_decode_rope where it applies; unset/"0" = rope_kv_write +
// attention_decode + the combine launch (the default). Read per call. H200, 2026-12-04 (llama3-8b
// NF4-dq, b3964cf): kernel-bench faster alone (ctx 512 9.66 vs 10.67 us, 4096 19.20 vs 22.12) but
// slower at 32768 (73.57 vs 64.31) and end to end (decode @512 376.3 vs 378.4 tok/s, @32768 177.7
// vs 236.4; in a captured layer chain at ctx 512 72.73 vs 72.65 us), so it is opt-in. In plain
// blocks (NF4FLASH_DECODE_CLUSTER=1, 1ab13e7): ctx 512 11.42 vs 10.58 us, 4096 17.29 vs 22.18,
// 32768 64.22 vs 64.19; layer chain 71.96 vs 70.24 us; decode @512 381.1 vs 388.0, @32768 239.4
// vs 241.8.
bool attention_decode_rope_enabled() { return env_switch("NF4FLASH_DECODE_FUSED", "0", "1"); }

// Clusters of C blocks of the fused decode kernel resident at once on this GPU (bf16 instance; the
// others use the same block size and about the same registers and shared memory).
int decode_rope_resident_clusters(int C) {
  static int cached[9] = {};
  auto kern = attn_decode_kernel<__nv_bfloat16, __nv_bfloat16, 128, 4, true>;
  if (C == 1 && !cached[1]) {  // plain blocks
    int per_sm = 0, dev = 0, sms = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 128, 0));
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cached[1] = std::max(per_sm * sms, 1);
  }
  if (!cached[C]) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, unsigned(C), 1);
    cfg.blockDim = dim3(128);
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = unsigned(C);
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kern, &cfg));
    cached[C] = std::max(n, 1);
  }
  return cached[C];
}

// Splits per thread-block cluster of the fused decode kernel (NF4FLASH_DECODE_CLUSTER: 1, 2, 4 or 8;
// default 8; 1 = plain blocks merged by the last block of each head column). Read per call.
int decode_rope_cluster() {
  const char* e = std::getenv("NF4FLASH_DECODE_CLUSTER");
  if (!e || !*e) return 8;
  const std::string_view v(e);
  NF4FLASH_CHECK(v == "1" || v == "2" || v == "4" || v == "8", "NF4FLASH_DECODE_CLUSTER=", v, ": expected 1, 2, 4 or 8");
  return std::atoi(e);
}

std::string attention_decode_rope_unsupported(const AttnArgs& a) {
  static const int cc_major = [] {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major;
  }();
  if (!attention_decode_rope_enabled()) return "not asked for (NF4FLASH_DECODE_FUSED=1 turns it on)";
  if (a.T != 1) return cat("one token per step only (T=", a.T, ")");
  if (cc_major < 9) return "thread-block clusters need compute capability 9.0";
  if (!a.inv_freq || !a.k_new || !a.v_new) return "no rope frequencies or k/v rows";
  if (decode_use_mma(a)) return "the tensor-core decode kernel was asked for (NF4FLASH_DECODE_KERNEL=mma)";
  if (attention_combine_fused()) return "the split kernel's own merge was asked for (NF4FLASH_ATTN_COMBINE=fused)";
  if (decode_ring() == 0) return "the register-load decode kernel was asked for (NF4FLASH_DECODE_RING=0)";
  if (decode_interleave()) return "the interleaved split order was asked for (NF4FLASH_DECODE_ORDER=interleave)";
  if (!a.counters) return "no merge counters";
  return "";
}

void attention_decode_rope(const AttnArgs& a, cudaStream_t st) {
  const std::string why = attention_decode_rope_unsupported(a);
  NF4FLASH_CHECK(why.empty(), "attention_decode_rope: ", why);
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  const int G = a.n_heads / a.n_kv, hchunks = (G + kDecGT - 1) / kDecGT;
  // splits: the split kernel's count rounded down to whole clusters of up to 8 (portable size),
  // and to the clusters the GPU holds at once (H200, 2026-12-04: 64 splits x 8 kv heads in clusters
  // of 8 ran at ctx 32768 in 99 us against 64 us for the split kernel's 66 x 8 without clusters: a
  // second wave of clusters)
  const int base = decode_splits(a, hchunks, false);
  int C = decode_rope_cluster();
  while (C > base) C /= 2;
  const int cols = a.n_kv * hchunks;
  const int resident = decode_rope_resident_clusters(C);
  int nsplit = base / C * C;
  if (resident >= cols) nsplit = std::min(nsplit, resident / cols * C);
  NF4FLASH_CHECK(int64_t(a.n_heads) * nsplit * (a.head_dim + 2) <= a.workspace_floats,
                 "attention_decode_rope: workspace too small");
  NF4FLASH_CHECK(int64_t(a.n_kv) * hchunks <= kDecodeCounters, "attention_decode_rope: too many heads for the counters");
  dispatch_attn(a, "attention (decode, rope fused)", [&](auto ta, auto tk, auto hd) {
    using TA = decltype(ta);
    using TK = decltype(tk);
    constexpr int HD = decltype(hd)::value;
    AttnArgs k = a;
    k.dec_min_chunk = decode_min_chunk();
    k.dec_cluster = C;
    cudaLaunchAttribute attrs[2];
    cudaLaunchConfig_t cfg = pdl_launch_config(dim3(unsigned(a.n_kv * hchunks), unsigned(nsplit), 1u), dim3(128), 0,
                                               st, &attrs[0]);
    if (C > 1) {  // C = 1: plain blocks (no cluster attribute)
      attrs[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attrs[cfg.numAttrs].val.clusterDim.x = 1;
      attrs[cfg.numAttrs].val.clusterDim.y = unsigned(C);
      attrs[cfg.numAttrs].val.clusterDim.z = 1;
      cfg.attrs = attrs;
      cfg.numAttrs += 1;
    }
    CUDA_CHECK(cudaLaunchKernelEx(&cfg, attn_decode_kernel<TA, TK, HD, 4, true>, k, nsplit, hchunks));
    CUDA_CHECK_LAUNCH();
  });
}

void attention_prefill(const AttnArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  if (a.T == 0) return;
  dispatch_attn(a, "attention (prefill)", [&](auto ta, auto tk, auto hd) {
    using TA = decltype(ta);
    using TK = decltype(tk);
    constexpr int HD = decltype(hd)::value;
    dim3 grid(static_cast<unsigned>((a.T + 15) / 16), static_cast<unsigned>(a.n_heads));
    attn_prefill_kernel<TA, TK, HD><<<grid, 128, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
  });
}

std::string attention_flash_unsupported(DType act, DType kv_dtype, int head_dim) {
  if (act != DType::BF16 && act != DType::F16)
    return cat("--attn flash: the FlashAttention-2 tensor-core kernel needs bf16 or f16 compute, not ",
               dtype_name(act), " (use --attn sdpa or eager, or --compute-dtype bf16)");
  if (kv_dtype != act)
    return cat("--attn flash: the KV cache dtype ", dtype_name(kv_dtype), " must equal the compute dtype ", dtype_name(act));
  if (head_dim != 64 && head_dim != 128)
    return cat("unsupported head_dim ", head_dim, " for --attn flash; supported: 64, 128");
  return "";
}

// Which flash kernel runs: the Hopper one (wgmma + TMA) wherever it is built and the GPU is CC 9.0,
// else the portable mma.sync one. NF4FLASH_FLASH_KERNEL=auto|mma|wgmma|wgmma-serial forces a
// choice (wgmma-serial: the Hopper kernel without the FA3 overlap schedules; read per call:
// kernel-bench switches it); wgmma where it cannot run is an error, never a fallback.
FlashKernel attention_flash_kernel() {
  const char* k = std::getenv("NF4FLASH_FLASH_KERNEL");
  const std::string_view m = k ? k : "";
  if (m.empty() || m == "auto") return attention_flash_wgmma_supported() ? FlashKernel::Wgmma : FlashKernel::Mma;
  NF4FLASH_CHECK(m == "wgmma" || m == "wgmma-serial" || m == "mma", "NF4FLASH_FLASH_KERNEL=", m,
                 ": expected auto, mma, wgmma or wgmma-serial");
  if (m == "mma") return FlashKernel::Mma;
  NF4FLASH_CHECK(attention_flash_wgmma_supported(), "NF4FLASH_FLASH_KERNEL=", m, ": needs a compute capability 9.0 GPU "
                 "and a build for sm_90a");
  return m == "wgmma" ? FlashKernel::Wgmma : FlashKernel::WgmmaSerial;
}

void attention_flash(const AttnArgs& a, cudaStream_t st) {
  const std::string why = attention_flash_unsupported(a.act, a.kv_dtype, a.head_dim);
  NF4FLASH_CHECK(why.empty(), why);
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  NF4FLASH_CHECK(a.q_stride % 8 == 0 && a.out_stride % 2 == 0, "attention_flash: q/out row strides must be multiples of 8/2 elements");
  if (a.T == 0) return;
  if (const FlashKernel k = attention_flash_kernel(); k != FlashKernel::Mma)
    return attention_flash_wgmma(a, st, k == FlashKernel::Wgmma);
  // K/V ring depth; NF4FLASH_FLASH_STAGES=2|3 selects it for measurements (kernel-bench).
  static const int stages = [] {
    const char* e = std::getenv("NF4FLASH_FLASH_STAGES");
    return e && std::string(e) == "2" ? 2 : 3;
  }();
  auto launch = [&](auto kernel, int hd) {
    const int smem = flash_smem_bytes(hd, stages);
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>((a.T + kFlashBQ - 1) / kFlashBQ));
    kernel<<<grid, kFlashThreads, smem, st>>>(a);
    CUDA_CHECK_LAUNCH();
  };
  const bool bf = a.act == DType::BF16;
  auto pick = [&](auto s) {
    constexpr int S = decltype(s)::value;
    if (a.head_dim == 64) {
      if (bf) launch(attn_flash_kernel<__nv_bfloat16, 64, S>, 64);
      else launch(attn_flash_kernel<__half, 64, S>, 64);
    } else {
      if (bf) launch(attn_flash_kernel<__nv_bfloat16, 128, S>, 128);
      else launch(attn_flash_kernel<__half, 128, S>, 128);
    }
  };
  if (stages == 2) pick(std::integral_constant<int, 2>{});
  else pick(std::integral_constant<int, 3>{});
}

void attention_eager_softmax(const EagerSoftmaxArgs& a, cudaStream_t st) {
  if (a.rows == 0 || a.heads == 0) return;
  NF4FLASH_DISPATCH_ACT(a.p_dtype, "attention (eager softmax)", [&] {
    attn_eager_softmax_kernel<T><<<dim3(unsigned(a.rows), unsigned(a.heads)), 256, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace nf4flash::cuda
