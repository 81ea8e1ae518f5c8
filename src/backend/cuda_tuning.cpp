// CudaTuning from the environment, and the scoped override (cuda_tuning.h). Compiled in every build
// (the parsing is tested without a GPU).
#include "backend/cuda_tuning.h"

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "core/error.h"

namespace nf4flash {

namespace {
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int64_t env_int(const char* name, int64_t lo, int64_t hi, int64_t dflt) {
  const char* v = env(name);
  if (!v) return dflt;
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno || end == v || *end || x < lo || x > hi)
    fail(name, "=", v, ": expected an integer in ", lo, "..", hi);
  return x;
}

bool env_bool(const char* name, bool dflt) {
  const char* v = env(name);
  if (!v) return dflt;
  const std::string_view s(v);
  if (s != "0" && s != "1") fail(name, "=", s, ": expected 0 or 1");
  return s == "1";
}

// The kernel choice variable `name` (auto, mma or wgmma), or dflt where it is unset.
MmaKernelChoice env_kernel_choice(const char* name, MmaKernelChoice dflt) {
  const char* v = env(name);
  if (!v) return dflt;
  const std::string_view s(v);
  if (s == "auto") return MmaKernelChoice::Auto;
  if (s == "mma") return MmaKernelChoice::Mma;
  if (s == "wgmma") return MmaKernelChoice::Wgmma;
  fail(name, "=", s, ": expected auto, mma or wgmma");
}

std::mutex g_mu;
std::optional<CudaTuning> g_override;
}  // namespace

std::string q4_gemm_mode_name(Q4GemmMode m) {
  switch (m) {
    case Q4GemmMode::Auto: return "auto";
    case Q4GemmMode::Fused: return "fused";
    case Q4GemmMode::Dequant: return "dequant";
  }
  return "?";
}

std::string mma_kernel_choice_name(MmaKernelChoice k) {
  switch (k) {
    case MmaKernelChoice::Auto: return "auto";
    case MmaKernelChoice::Mma: return "mma";
    case MmaKernelChoice::Wgmma: return "wgmma";
  }
  return "?";
}

CudaTuning cuda_tuning_from_env() {
  CudaTuning t;
  t.pdl = env_bool("NF4FLASH_PDL", t.pdl);
  t.gemv_max_rows = int(env_int("NF4FLASH_GEMV_MAX_ROWS", 0, 256, t.gemv_max_rows));
  t.q4_skinny_max_rows = int(env_int("NF4FLASH_Q4_SKINNY_MAX_ROWS", 0, 64, t.q4_skinny_max_rows));
  t.q4_skinny_kernel = env_kernel_choice("NF4FLASH_Q4_SKINNY_KERNEL", t.q4_skinny_kernel);
  if (const char* v = env("NF4FLASH_Q4_GEMM")) {
    const std::string_view s(v);
    if (s == "auto") t.q4_gemm = Q4GemmMode::Auto;
    else if (s == "fused") t.q4_gemm = Q4GemmMode::Fused;
    else if (s == "dequant") t.q4_gemm = Q4GemmMode::Dequant;
    else fail("NF4FLASH_Q4_GEMM=", s, ": expected auto, fused or dequant");
  }
  t.q4_fused_max_rows = env_int("NF4FLASH_Q4GEMM_FUSED_MAX_ROWS", 0, int64_t(1) << 20, t.q4_fused_max_rows);
  t.dequant_chunk_mb = int(env_int("NF4FLASH_DEQUANT_CHUNK_MB", 0, 4096, t.dequant_chunk_mb));
  t.flash_kernel = env_kernel_choice("NF4FLASH_FLASH_KERNEL", t.flash_kernel);
  t.stack_bytes = env_int("NF4FLASH_CUDA_STACK_BYTES", 0, int64_t(1) << 20, t.stack_bytes);
  t.vram_trace = env_bool("NF4FLASH_VRAM_TRACE", t.vram_trace);
  return t;
}

ScopedCudaTuning::ScopedCudaTuning(const CudaTuning& t) {
  std::lock_guard<std::mutex> lk(g_mu);
  prev_ = g_override;
  g_override = t;
}

ScopedCudaTuning::~ScopedCudaTuning() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_override = prev_;
}

CudaTuning cuda_tuning_current() {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_override) return *g_override;
  }
  return cuda_tuning_from_env();
}

}  // namespace nf4flash
