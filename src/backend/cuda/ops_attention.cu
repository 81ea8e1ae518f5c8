// Launchers of the attention kernels: decode and paged decode (kernels/attention.cuh +
// attention_combine.cuh), the CUDA-core prompt kernel ("sdpa", attention.cuh), flash
// (kernels/attention_flash.cuh; the Hopper form in sm90a/) and the eager softmax. One dispatch over
// (act dtype, cache dtype, head_dim): head_dim 64 and 128 with any cache dtype, 32, 80, 96 and 256
// with the cache in the compute dtype (as the engine allocates it); any other is refused by name.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#include "backend/cuda/kernels/attention.cuh"
#include "backend/cuda/kernels/attention_combine.cuh"
#include "backend/cuda/kernels/attention_eager.cuh"
#include "backend/cuda/kernels/attention_flash.cuh"

namespace nf4flash::cuda {

namespace {
// Splits of a decode launch: blocks of 4 warps, 4 blocks per SM (the CUDA-core kernel fills 4
// blocks per SM exactly for 8 kv heads), rounded up.
int decode_splits(const AttnArgs& a, int hchunks) {
  constexpr int kWaves = 4;
  const int per_split = a.n_kv * hchunks * a.T;
  const int n = (kWaves * a.num_sms + per_split - 1) / per_split;
  return std::clamp(n, 1, kDecodeMaxSplits);
}

template <typename F>
void dispatch_attn(const AttnArgs& a, const char* what, F&& f) {
  NF4FLASH_DISPATCH_ACT(a.act, what, [&] {
    using TA = T;
    NF4FLASH_DISPATCH_ACT(a.kv_dtype, what, [&] {
      using TK = T;
      if (a.head_dim == 64) return f(TA{}, TK{}, std::integral_constant<int, 64>{});
      if (a.head_dim == 128) return f(TA{}, TK{}, std::integral_constant<int, 128>{});
      if constexpr (std::is_same_v<TA, TK>) {
        if (a.head_dim == 32) return f(TA{}, TK{}, std::integral_constant<int, 32>{});
        if (a.head_dim == 80) return f(TA{}, TK{}, std::integral_constant<int, 80>{});
        if (a.head_dim == 96) return f(TA{}, TK{}, std::integral_constant<int, 96>{});
        if (a.head_dim == 256) return f(TA{}, TK{}, std::integral_constant<int, 256>{});
      } else if (attention_head_dim_supported(a.head_dim)) {
        fail(what, ": head_dim ", a.head_dim, " needs the KV cache in the compute dtype (",
             dtype_name(a.act), "), not ", dtype_name(a.kv_dtype));
      }
      fail(what, ": unsupported head_dim ", a.head_dim, " (supported: 32, 64, 80, 96, 128, 256)");
    });
  });
}
// The soft-capped decode kernel (a template of its own: the cap's tanh kept out of the other
// kernels' inner loop), for caches in the compute dtype only.
template <typename TA, typename TK, int HD, bool PAGED>
void launch_decode_softcap(dim3 grid, cudaStream_t st, const AttnArgs& a, int nsplit, int hchunks) {
  if constexpr (std::is_same_v<TA, TK>)
    launch_k(attn_decode_kernel<TA, TK, HD, PAGED, true>, grid, dim3(128), 0, st, a, nsplit, hchunks);
  else
    fail("attention (decode): soft-capping needs the KV cache in the compute dtype (", dtype_name(a.act), "), not ",
         dtype_name(a.kv_dtype));
}
}  // namespace

int64_t attention_decode_workspace_floats(int T, int n_heads, int head_dim) {
  return int64_t(T) * n_heads * kDecodeMaxSplits * (head_dim + 2);
}

void attention_decode(const AttnArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(a.T >= 1 && a.T <= kDecodeMaxRows, "attention_decode: T=", a.T, " outside 1..", kDecodeMaxRows);
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  const int G = a.n_heads / a.n_kv;
  const int hchunks = (G + kDecGT - 1) / kDecGT;
  const int nsplit = decode_splits(a, hchunks);
  NF4FLASH_CHECK(int64_t(a.T) * a.n_heads * nsplit * (a.head_dim + 2) <= a.workspace_floats,
                 "attention_decode: workspace too small");
  dispatch_attn(a, "attention (decode)", [&](auto ta, auto tk, auto hd) {
    using TA = decltype(ta);
    using TK = decltype(tk);
    constexpr int HD = decltype(hd)::value;
    const dim3 grid(static_cast<unsigned>(a.n_kv * hchunks), static_cast<unsigned>(nsplit), static_cast<unsigned>(a.T));
    if (a.softcap > 0) launch_decode_softcap<TA, TK, HD, false>(grid, st, a, nsplit, hchunks);
    else launch_k(attn_decode_kernel<TA, TK, HD>, grid, dim3(128), 0, st, a, nsplit, hchunks);
    CUDA_CHECK_LAUNCH();
    launch_k(attn_combine_wide_kernel<TA, HD>, dim3(a.n_heads, a.T), dim3(128), 0, st, a, nsplit, a.T);
    CUDA_CHECK_LAUNCH();
  });
}

int64_t attention_paged_workspace_floats(const AttnArgs& a) {
  const int hchunks = (a.n_heads / std::max(a.n_kv, 1) + kDecGT - 1) / kDecGT;
  return int64_t(a.T) * a.n_heads * decode_splits(a, hchunks) * (a.head_dim + 2);
}

void attention_paged_decode(const AttnArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(a.paged.tables && a.paged.n_seqs >= 1 && a.paged.block_size >= 1, "attention_paged_decode: no paged rows");
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  if (a.T == 0) return;
  const int hchunks = (a.n_heads / a.n_kv + kDecGT - 1) / kDecGT;
  const int nsplit = decode_splits(a, hchunks);
  NF4FLASH_CHECK(attention_paged_workspace_floats(a) <= a.workspace_floats, "attention_paged_decode: workspace too small");
  dispatch_attn(a, "attention (paged decode)", [&](auto ta, auto tk, auto hd) {
    using TA = decltype(ta);
    using TK = decltype(tk);
    constexpr int HD = decltype(hd)::value;
    const dim3 grid(static_cast<unsigned>(a.n_kv * hchunks), static_cast<unsigned>(nsplit), static_cast<unsigned>(a.T));
    if (a.softcap > 0) launch_decode_softcap<TA, TK, HD, true>(grid, st, a, nsplit, hchunks);
    else launch_k(attn_decode_kernel<TA, TK, HD, true>, grid, dim3(128), 0, st, a, nsplit, hchunks);
    CUDA_CHECK_LAUNCH();
    launch_k(attn_combine_wide_kernel<TA, HD, true>, dim3(a.n_heads, a.T), dim3(128), 0, st, a, nsplit, a.T);
    CUDA_CHECK_LAUNCH();
  });
}

bool attention_head_dim_supported(int hd) {
  return hd == 32 || hd == 64 || hd == 80 || hd == 96 || hd == 128 || hd == 256;
}

void attention_prefill(const AttnArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  if (a.T == 0) return;
  dispatch_attn(a, "attention (prefill)", [&](auto ta, auto tk, auto hd) {
    using TA = decltype(ta);
    using TK = decltype(tk);
    constexpr int HD = decltype(hd)::value;
    const dim3 grid(static_cast<unsigned>((a.T + kPrefillBQ - 1) / kPrefillBQ), static_cast<unsigned>(a.n_heads));
    constexpr int smem = prefill_smem_bytes(HD);
    if constexpr (smem > 48 * 1024)
      CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel<TA, TK, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attn_prefill_kernel<TA, TK, HD><<<grid, 128, smem, st>>>(a);
    CUDA_CHECK_LAUNCH();
  });
}

std::string attention_flash_unsupported(DType act, DType kv_dtype, int head_dim) {
  if (act != DType::BF16 && act != DType::F16)
    return cat("--attn flash: the FlashAttention-2 tensor-core kernel needs bf16 or f16 compute, not ",
               dtype_name(act), " (use --attn sdpa or eager, or --compute-dtype bf16)");
  if (kv_dtype != act)
    return cat("--attn flash: the KV cache dtype ", dtype_name(kv_dtype), " must equal the compute dtype ", dtype_name(act));
  if (!attention_head_dim_supported(head_dim))
    return cat("unsupported head_dim ", head_dim, " for --attn flash; supported: 32, 64, 80, 96, 128, 256");
  return "";
}

void attention_flash(const AttnArgs& a, cudaStream_t st) {
  const std::string why = attention_flash_unsupported(a.act, a.kv_dtype, a.head_dim);
  NF4FLASH_CHECK(why.empty(), why);
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  NF4FLASH_CHECK(a.q_stride % 8 == 0 && a.out_stride % 2 == 0, "attention_flash: q/out row strides must be multiples of 8/2 elements");
  if (a.T == 0) return;
  // the Hopper kernel at head_dim 64, 128 and 256; the mma.sync kernel elsewhere and at the others
  if (a.flash == FlashKernel::Wgmma && attention_flash_wgmma_head_dim(a.head_dim)) return attention_flash_wgmma(a, st);
  auto launch = [&](auto hd) {
    constexpr int HD = decltype(hd)::value, stages = flash_stages(HD);
    const int smem = flash_smem_bytes(HD, stages);
    auto kernel = a.act == DType::BF16 ? attn_flash_kernel<__nv_bfloat16, HD, stages> : attn_flash_kernel<__half, HD, stages>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    dim3 grid(static_cast<unsigned>(a.n_heads), static_cast<unsigned>((a.T + kFlashBQ - 1) / kFlashBQ));
    kernel<<<grid, kFlashThreads, smem, st>>>(a);
    CUDA_CHECK_LAUNCH();
  };
  switch (a.head_dim) {
    case 32: return launch(std::integral_constant<int, 32>{});
    case 64: return launch(std::integral_constant<int, 64>{});
    case 80: return launch(std::integral_constant<int, 80>{});
    case 96: return launch(std::integral_constant<int, 96>{});
    case 128: return launch(std::integral_constant<int, 128>{});
    default: return launch(std::integral_constant<int, 256>{});
  }
}

void attention_eager_softmax(const EagerSoftmaxArgs& a, cudaStream_t st) {
  if (a.rows == 0 || a.heads == 0) return;
  NF4FLASH_DISPATCH_ACT(a.p_dtype, "attention (eager softmax)", [&] {
    attn_eager_softmax_kernel<T><<<dim3(unsigned(a.rows), unsigned(a.heads)), 256, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace nf4flash::cuda
