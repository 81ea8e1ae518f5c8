// Hopper warpgroup MMA (wgmma, sm_90a only) helpers: shared-memory matrix descriptors for the
// 128-byte-swizzled K-major layout, the fence / commit / wait instructions and the
// D[64 x N] (f32) += A[64 x 16] * B[N x 16]^T step with A in registers and B in shared memory
// (RS), for N = 32, 64, 128, 256 and bf16 or f16 inputs, B K-major or (TRANS_B) MN-major; and the
// m64n64k16 step with A in shared memory too (SS).
//
// Shared-memory operand layout ("K-major, 128B swizzle", CUTLASS's Layout_K_SW128): a tile of R
// rows (the N rows of B) by 64 K-values of 16 bits; row r's 128 bytes at r * 128 in a
// 1024-byte-aligned buffer, its 16-byte chunk c (K values 8c .. 8c+7) stored at chunk position
// c ^ (r % 8). Groups of 8 rows are 1024 bytes apart (the descriptor's stride byte offset); the
// k-th 16-wide K step starts 32k bytes into the rows (descriptor start address + 32k).
//
// Accumulator fragment of m64nNk16 (f32): warp w of the warpgroup, lane = 4g + t, register
// d[4j + e] (j < N/8) holds row 16w + g + 8 (e >> 1), column 8j + 2t + (e & 1).
#pragma once
#include <cstdint>

namespace nf4flash::cuda {

// Descriptor of a K-major SW128 tile at shared-window address `addr` (1024-byte aligned for the
// swizzle pattern to match the stores; + 32k for K step k).
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4)   // start address
         | (uint64_t(1) << 16)             // leading byte offset (unused for swizzled K-major)
         | (uint64_t(1024 >> 4) << 32)     // stride byte offset: 8 rows x 128 bytes
         | (uint64_t(1) << 62);            // swizzle mode 1 = 128 bytes
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NF4FLASH_SM90A_ASM(...) asm volatile(__VA_ARGS__)
#else
#define NF4FLASH_SM90A_ASM(...) \
  do {                          \
  } while (0)
#endif
__device__ __forceinline__ void wgmma_fence() { NF4FLASH_SM90A_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { NF4FLASH_SM90A_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  NF4FLASH_SM90A_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Make generic-proxy writes to shared memory (st.shared, cp.async) visible to wgmma's reads.
__device__ __forceinline__ void fence_proxy_async_smem() {
  NF4FLASH_SM90A_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keep the compiler from moving accumulator accesses across wgmma issue / wait.
template <int R>
__device__ __forceinline__ void wgmma_fence_regs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The m64nNk16 RS instruction, N = 32, 64, 128, 256: operands %0 .. %(N/2 - 1) are the accumulators
// (NF4FLASH_D32(i): d[i .. i + 31]), then the 4 A registers, the B descriptor and the scale-d flag.
#define NF4FLASH_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
    "+f"(d[i + 6]), "+f"(d[i + 7])
#define NF4FLASH_D32(i) NF4FLASH_D8(i), NF4FLASH_D8(i + 8), NF4FLASH_D8(i + 16), NF4FLASH_D8(i + 24)
#define NF4FLASH_OPS16_0 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define NF4FLASH_OPS16_1 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define NF4FLASH_OPS16_2 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define NF4FLASH_OPS16_3 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define NF4FLASH_OPS16_4 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79"
#define NF4FLASH_OPS16_5 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define NF4FLASH_OPS16_6 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111"
#define NF4FLASH_OPS16_7 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define NF4FLASH_WGMMA_RS_ASM(SHAPE, TY, TB, DOPS, AOPS, DESC, SCALE, ...)                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                             \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." TY "." TY " {" DOPS "}, {" AOPS "}, " DESC          \
               ", p, 1, 1, " TB ";\n}\n"                                                                       \
               : __VA_ARGS__                                                                                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d))
#define NF4FLASH_WGMMA_RS_N32(TY, TB)                                                                           \
  NF4FLASH_WGMMA_RS_ASM("m64n32k16", TY, TB, NF4FLASH_OPS16_0, "%16, %17, %18, %19", "%20", "%21", NF4FLASH_D8(0), \
                        NF4FLASH_D8(8))
#define NF4FLASH_WGMMA_RS_N64(TY, TB)                                                                           \
  NF4FLASH_WGMMA_RS_ASM("m64n64k16", TY, TB, NF4FLASH_OPS16_0 "," NF4FLASH_OPS16_1, "%32, %33, %34, %35", "%36", \
                        "%37", NF4FLASH_D32(0))
#define NF4FLASH_WGMMA_RS_N128(TY, TB)                                                                          \
  NF4FLASH_WGMMA_RS_ASM("m64n128k16", TY, TB,                                                                   \
                        NF4FLASH_OPS16_0 "," NF4FLASH_OPS16_1 "," NF4FLASH_OPS16_2 "," NF4FLASH_OPS16_3,         \
                        "%64, %65, %66, %67", "%68", "%69", NF4FLASH_D32(0), NF4FLASH_D32(32))
#define NF4FLASH_WGMMA_RS_N256(TY, TB)                                                                          \
  NF4FLASH_WGMMA_RS_ASM("m64n256k16", TY, TB,                                                                   \
                        NF4FLASH_OPS16_0 "," NF4FLASH_OPS16_1 "," NF4FLASH_OPS16_2 "," NF4FLASH_OPS16_3 ","      \
                            NF4FLASH_OPS16_4 "," NF4FLASH_OPS16_5 "," NF4FLASH_OPS16_6 "," NF4FLASH_OPS16_7,     \
                        "%128, %129, %130, %131", "%132", "%133", NF4FLASH_D32(0), NF4FLASH_D32(32), NF4FLASH_D32(64), \
                        NF4FLASH_D32(96))

// d (N/2 floats per thread) = scale_d ? d + A * B^T : A * B^T with A in registers ("RS") and B
// given by a descriptor: a[0..3] = lane (g, t) of warp w's fragment of rows 16w + g
// (a[0], a[2]) and 16w + g + 8 (a[1], a[3]) at K slots 2t, 2t + 1 (a[0], a[1]) and 2t + 8, 2t + 9
// (a[2], a[3]), two 16-bit values per register, lower K slot in the low half (mma.m16n8k16's A).
// TRANS_B: B is MN-major (N contiguous in shared memory; wgmma_desc_sw128_mn) instead of K-major.
// The registers must stay unchanged until the wgmma completes (wgmma_wait).
template <int N, bool BF16, bool TRANS_B = false>
__device__ __forceinline__ void wgmma_rs(float* d, const uint32_t* a, uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NF4FLASH_WGMMA_PICK(M)                                        \
  if constexpr (BF16) {                                               \
    if constexpr (TRANS_B) M("bf16", "1"); else M("bf16", "0");       \
  } else {                                                            \
    if constexpr (TRANS_B) M("f16", "1"); else M("f16", "0");         \
  }
  if constexpr (N == 32) {
    NF4FLASH_WGMMA_PICK(NF4FLASH_WGMMA_RS_N32)
  } else if constexpr (N == 64) {
    NF4FLASH_WGMMA_PICK(NF4FLASH_WGMMA_RS_N64)
  } else if constexpr (N == 128) {
    NF4FLASH_WGMMA_PICK(NF4FLASH_WGMMA_RS_N128)
  } else {
    static_assert(N == 256, "wgmma_rs: N is 32, 64, 128 or 256");
    NF4FLASH_WGMMA_PICK(NF4FLASH_WGMMA_RS_N256)
  }
#undef NF4FLASH_WGMMA_PICK
#endif
}

// The m64n64k16 SS instruction: A and B both from shared memory (descriptors), K-major.
#define NF4FLASH_WGMMA_SS_N64(TY)                                                                               \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                     \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" NF4FLASH_OPS16_0 "," NF4FLASH_OPS16_1 \
               "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                                \
               : NF4FLASH_D32(0)                                                                                \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))

// d (32 floats per thread) = scale_d ? d + A * B^T : A * B^T, A [64 x 16] and B [64 x 16] both
// K-major in shared memory (wgmma_desc_sw128 descriptors): "SS", for an A operand too large to keep
// in registers (the flash kernel's Q at head_dim 256).
template <int N, bool BF16>
__device__ __forceinline__ void wgmma_ss(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(N == 64, "wgmma_ss: N is 64");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (BF16) NF4FLASH_WGMMA_SS_N64("bf16");
  else NF4FLASH_WGMMA_SS_N64("f16");
#endif
}

// Descriptor of an MN-major SW128 operand (CUTLASS's Layout_MN_SW128): atoms of 64 N-values
// (128 bytes, contiguous) x 8 K-rows (128 bytes apart, 16-byte chunks swizzled by row % 8 --
// what a TMA box of 64 columns with 128-byte swizzle writes); K-row groups of 8 are sbo bytes
// apart (1024 for a dense tile), atoms along N lbo bytes apart (the next 64-column box).
__device__ __forceinline__ uint64_t wgmma_desc_sw128_mn(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

}  // namespace nf4flash::cuda
