// The CUDA backend's tuning: one typed struct, filled from the environment once when a backend is
// created (cuda_tuning_from_env), or given in CudaBackendOptions. Every field has the default the
// measurements chose (docs/performance.md); the environment variables exist for users who compare
// paths, and an invalid value is an error naming the variable. Tests set the struct (a scoped
// override, ScopedCudaTuning), never the environment.
//
//   NF4FLASH_PDL                    0|1          programmatic dependent launch (CC >= 9.0)
//   NF4FLASH_GEMV_MAX_ROWS          0..256       4-bit linears of up to this many rows take a GEMV
//   NF4FLASH_Q4_SKINNY_MAX_ROWS     0..64        auto: the skinny 4-bit GEMM above the GEMV rows up to this
//   NF4FLASH_Q4_SKINNY_KERNEL       auto|mma|wgmma  the skinny GEMM at 17..32 rows: wgmma where it runs, or as named
//   NF4FLASH_Q4_GEMM                auto|fused|dequant   4-bit products above the GEMV (and skinny) rows
//   NF4FLASH_Q4GEMM_FUSED_MAX_ROWS  0..1048576   rows up to which auto takes the fused GEMM
//   NF4FLASH_DEQUANT_CHUNK_MB       0..4096      dequantize + cuBLAS in row chunks of this size
//   NF4FLASH_FLASH_KERNEL           auto|mma|wgmma       the prompt flash kernel
//   NF4FLASH_CUDA_STACK_BYTES       0..1048576   per-thread stack limit
//   NF4FLASH_VRAM_TRACE             0|1          device memory after each setup step, on stderr
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace nf4flash {

enum class Q4GemmMode : uint8_t { Auto, Fused, Dequant };
// A tensor-core kernel choice: the wgmma kernel where it runs (auto), or the one named.
enum class MmaKernelChoice : uint8_t { Auto, Mma, Wgmma };
using FlashKernelChoice = MmaKernelChoice;   // NF4FLASH_FLASH_KERNEL
using SkinnyKernelChoice = MmaKernelChoice;  // NF4FLASH_Q4_SKINNY_KERNEL

struct CudaTuning {
  bool pdl = true;
  int gemv_max_rows = 8;  // launchers.h kGemvMaxRows: why 8
  // auto only: rows gemv_max_rows+1 .. this take the skinny GEMM (0: none). 32: on the H100 it beat
  // the fused GEMM at 32 rows (bench --batch 32: 4713 tok/s against 4435) but not at 64 (6409
  // against 7189 with the fused GEMM)
  int q4_skinny_max_rows = 32;
  // its products at 17..32 rows: auto = the wgmma form where it runs (sm_90a build, CC 9.0; H100
  // bench --batch 32: 5,180 / 5,165 tok/s against 4,929 / 4,940 with mma.sync), else mma.sync
  SkinnyKernelChoice q4_skinny_kernel = SkinnyKernelChoice::Auto;
  Q4GemmMode q4_gemm = Q4GemmMode::Auto;
  int64_t q4_fused_max_rows = 512;
  int dequant_chunk_mb = 32;
  FlashKernelChoice flash_kernel = FlashKernelChoice::Auto;
  int64_t stack_bytes = 0;
  bool vram_trace = false;
  // Struct only (tests select the paths with them; no environment variable):
  // the 4-bit decode GEMV folds the next rms_norm into its prologue (false: the unfused order)
  bool fuse_norm = true;
  // a dense 16-bit decode step puts q/k/v and gate+up(+SiLU) into one launch each (false: one
  // launch per weight and silu_mul)
  bool dense_multi = true;
};

// The defaults with every NF4FLASH_* tuning variable that is set applied. Throws Error naming the
// variable, its value and the accepted values when one is invalid.
CudaTuning cuda_tuning_from_env();
std::string q4_gemm_mode_name(Q4GemmMode m);
std::string mma_kernel_choice_name(MmaKernelChoice k);

// While alive, backends created without an explicit tuning (CudaBackendOptions::tuning unset, as
// the engine creates them) take `t` instead of the environment's. Process-wide; nests (the
// previous override returns at destruction). For tests and benchmarks that compare paths.
class ScopedCudaTuning {
 public:
  explicit ScopedCudaTuning(const CudaTuning& t);
  ~ScopedCudaTuning();
  ScopedCudaTuning(const ScopedCudaTuning&) = delete;
  ScopedCudaTuning& operator=(const ScopedCudaTuning&) = delete;

 private:
  std::optional<CudaTuning> prev_;
};
// The tuning a backend created now without an explicit one takes: the innermost override, else
// cuda_tuning_from_env().
CudaTuning cuda_tuning_current();

}  // namespace nf4flash
