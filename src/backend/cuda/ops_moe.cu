// Launchers of the mixture-of-experts kernels (kernels/moe.cuh, kernels/moe_down_combine.cuh).
#include <algorithm>
#include <type_traits>

#include "backend/cuda/kernels/moe_down_combine.cuh"

namespace nf4flash::cuda {

namespace {
// Opts Kernel into Bytes of dynamic shared memory (the per-lane code table's 64 KB and what
// follows it), once.
template <auto Kernel, int Bytes = kQ4LutBytes>
void opt_in_lut() {
  static const bool opted = [] {
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Bytes));
    return true;
  }();
  (void)opted;
}
}  // namespace

static_assert(kMoeMaxExperts <= 32 * 16, "moe_route_kernel<16> holds 16 experts a lane");

void moe_route(const MoeRouteArgs& a, cudaStream_t st) {
  if (a.T == 0) return;
  // a warp a row, at most kMoeRouteWarps (the rows past them loop); the grouping runs over the block
  const dim3 block(32 * std::min(a.T, kMoeRouteWarps));
  // experts a lane holds: the fewest of 1, 4, 8, 16 that cover E (kMoeMaxExperts = 512)
  if (a.E <= 32) launch_k(moe_route_kernel<1>, dim3(1), block, 0, st, a);
  else if (a.E <= 128) launch_k(moe_route_kernel<4>, dim3(1), block, 0, st, a);
  else if (a.E <= 256) launch_k(moe_route_kernel<8>, dim3(1), block, 0, st, a);
  else launch_k(moe_route_kernel<16>, dim3(1), block, 0, st, a);
  CUDA_CHECK_LAUNCH();
}

void moe_gemv(const MoeGemvArgs& args, MoeKind kind, bool swiglu, int64_t max_chunks, int max_pairs, DType act,
              cudaStream_t st) {
  MoeGemvArgs a = args;
  // the one-row form (CH = 1) serves a decode step's gate and up of 4-bit experts at bf16/f16 (its
  // down products go through moe_down_combine); dense experts, f32 compute and down products
  // otherwise take the chunk form for one row too (the same arithmetic, fewer kernels to build)
  const bool one_row = swiglu && max_pairs == 1 && moe_one_row_applies(kind, act, a.m[0].cols);
  NF4FLASH_CHECK(!a.logits || (one_row && a.E >= 1 && a.E <= kMoeFoldMaxExperts && max_chunks <= kMoeMaxTopK),
                 "moe_gemv: routing inside the launch serves one row of 4-bit gate/up at bf16/f16 and 1 to ",
                 kMoeFoldMaxExperts, " experts");
  // warps a unit: the one-row form with few 64-column tiles a row takes fewer warps each, four
  // tiles a warp, and more units at a time; else all 8
  a.wpu = kMoeWarps;
  a.one_row_chunks = int(max_chunks);  // one row: K experts, one pair each
  if (one_row)
    while (a.wpu > 1 && a.m[0].KT < int64_t(a.wpu) * 4) a.wpu /= 2;
  const int64_t G = kMoeWarps / a.wpu, units = max_chunks * a.m[0].RT;
  if (units == 0) return;
  // resident blocks: 256 threads of at most 128 registers (and the one-row form's table and x row, 66-98 KB) leave 2 per SM
  const unsigned grid = unsigned(std::min<int64_t>((units + G - 1) / G, int64_t(device_sm_count()) * 2));
  NF4FLASH_DISPATCH_ACT(act, "moe_gemv", [&] {
    auto run = [&](auto kernel) { launch_k(kernel, dim3(grid), dim3(kMoeWarps * 32), 0, st, a); };
    // the one-row form's per-lane code table (64 KB) and x row in dynamic shared memory (opted in
    // once per kernel for the largest x row)
    auto run_one_row = [&](auto tag) {
      constexpr auto kernel = decltype(tag)::value;
      constexpr int max_bytes = kQ4LutBytes + int(kMoeOneRowMaxCols) * int(sizeof(T));
      opt_in_lut<kernel, max_bytes>();
      launch_k(kernel, dim3(grid), dim3(kMoeWarps * 32), size_t(kQ4LutBytes) + size_t(a.m[0].cols) * sizeof(T), st, a);
    };
    auto by_op = [&](auto tag) {
      constexpr MoeKind K = decltype(tag)::value;
      if constexpr (K != MoeKind::Dense && !std::is_same_v<T, float>) {
        if (one_row)
          return run_one_row(std::integral_constant<decltype(&moe_gemv_kernel<T, K, true, 1>),
                                                    &moe_gemv_kernel<T, K, true, 1>>{});
      }
      swiglu ? run(moe_gemv_kernel<T, K, true, kMoeChunk>) : run(moe_gemv_kernel<T, K, false, kMoeChunk>);
    };
    switch (kind) {
      case MoeKind::Q4: by_op(std::integral_constant<MoeKind, MoeKind::Q4>{}); break;
      case MoeKind::Q4DoubleQuant: by_op(std::integral_constant<MoeKind, MoeKind::Q4DoubleQuant>{}); break;
      case MoeKind::Dense: by_op(std::integral_constant<MoeKind, MoeKind::Dense>{}); break;
    }
    CUDA_CHECK_LAUNCH();
  });
}

void moe_down_combine(const MoeDownCombineArgs& a, MoeKind kind, DType act, cudaStream_t st) {
  NF4FLASH_CHECK(moe_down_combine_applies(kind, act, a.sum.K), "moe_down_combine: 4-bit experts at bf16/f16, 1 to ",
                 kMoeDcWarps, " a row (", a.sum.K, " given)");
  if (a.m.RT == 0) return;
  // one block of 16 warps a multiprocessor (up to 128 registers a thread); row tiles spread over them
  const unsigned grid = unsigned(std::min<int64_t>(a.m.RT, device_sm_count()));
  NF4FLASH_DISPATCH_ACT(act, "moe_down_combine", [&] {
    auto by_type = [&](auto type) {  // a template, so that f32 (refused above) instantiates nothing
      using TA = typename decltype(type)::type;
      if constexpr (!std::is_same_v<TA, float>) {
        auto run = [&](auto tag) {
          constexpr auto kernel = decltype(tag)::value;
          opt_in_lut<kernel>();
          launch_k(kernel, dim3(grid), dim3(kMoeDcWarps * 32), size_t(kQ4LutBytes), st, a);
        };
        if (kind == MoeKind::Q4DoubleQuant)
          run(std::integral_constant<decltype(&moe_down_combine_kernel<TA, MoeKind::Q4DoubleQuant>),
                                     &moe_down_combine_kernel<TA, MoeKind::Q4DoubleQuant>>{});
        else
          run(std::integral_constant<decltype(&moe_down_combine_kernel<TA, MoeKind::Q4>),
                                     &moe_down_combine_kernel<TA, MoeKind::Q4>>{});
        CUDA_CHECK_LAUNCH();
      }
    };
    by_type(std::type_identity<T>{});
  });
}

void moe_combine(const MoeCombineArgs& a, DType act, cudaStream_t st) {
  if (a.T == 0) return;
  const dim3 grid(unsigned((a.cols + 255) / 256), unsigned(a.T));
  NF4FLASH_DISPATCH_ACT(act, "moe_combine", [&] {
    launch_k(moe_combine_kernel<T>, grid, dim3(256), 0, st, a);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace nf4flash::cuda
