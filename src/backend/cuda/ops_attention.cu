// Launchers of the attention kernels (kernels/attention.cuh): one dispatch over (act dtype,
// cache dtype, head_dim); head_dim other than 64/128 is refused by name.
#include <algorithm>

#include "backend/cuda/kernels/attention.cuh"

namespace nf4flash::cuda {

namespace {
int decode_splits(const AttnArgs& a) {
  const int G = a.n_heads / a.n_kv;
  const int hchunks = (G + kDecGT - 1) / kDecGT;
  const int per_split = a.n_kv * hchunks * a.T;
  return std::clamp((4 * a.num_sms + per_split - 1) / per_split, 1, kDecodeMaxSplits);
}

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

int64_t attention_decode_workspace_floats(int T, int n_heads, int head_dim) {
  return int64_t(T) * n_heads * kDecodeMaxSplits * (head_dim + 2);
}

void attention_decode(const AttnArgs& a, cudaStream_t st) {
  NF4FLASH_CHECK(a.T >= 1 && a.T <= kDecodeMaxRows, "attention_decode: T=", a.T, " outside 1..", kDecodeMaxRows);
  NF4FLASH_CHECK(a.n_kv > 0 && a.n_heads % a.n_kv == 0, "attention: n_heads ", a.n_heads,
                 " not a multiple of n_kv_heads ", a.n_kv);
  const int nsplit = decode_splits(a);
  NF4FLASH_CHECK(int64_t(a.T) * a.n_heads * nsplit * (a.head_dim + 2) <= a.workspace_floats,
                 "attention_decode: workspace too small");
  const int G = a.n_heads / a.n_kv, hchunks = (G + kDecGT - 1) / kDecGT;
  dispatch_attn(a, "attention (decode)", [&](auto ta, auto tk, auto hd) {
    using TA = decltype(ta);
    using TK = decltype(tk);
    constexpr int HD = decltype(hd)::value;
    dim3 grid(static_cast<unsigned>(a.n_kv * hchunks), static_cast<unsigned>(nsplit), static_cast<unsigned>(a.T));
    attn_decode_kernel<TA, TK, HD><<<grid, 128, 0, st>>>(a, nsplit, hchunks);
    CUDA_CHECK_LAUNCH();
    attn_combine_kernel<TA><<<dim3(a.n_heads, a.T), HD, 0, st>>>(a, nsplit, a.T);
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

}  // namespace nf4flash::cuda
