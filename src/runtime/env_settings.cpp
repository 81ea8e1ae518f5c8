// The table of NF4FLASH_* settings and their check (env_settings.h).
#include "runtime/env_settings.h"

#include <cstring>

#include "backend/cuda_tuning.h"
#include "core/error.h"
#include "parallel/tp_process.h"
#include "runtime/plan.h"

extern char** environ;

namespace nf4flash {

const std::vector<EnvSetting>& env_settings() {
  static const std::vector<EnvSetting> s = {
      {"NF4FLASH_PDL", "0|1", "programmatic dependent launch between kernels (compute capability >= 9.0; default 1)"},
      {"NF4FLASH_GEMV_MAX_ROWS", "0..256", "4-bit linears of up to this many rows take a GEMV (default 8)"},
      {"NF4FLASH_Q4_GEMM", "auto|fused|dequant", "4-bit products above the GEMV rows (default auto)"},
      {"NF4FLASH_Q4_SKINNY_MAX_ROWS", "0..64", "with NF4FLASH_Q4_GEMM=auto, rows above the GEMV rows up to this take the skinny 4-bit GEMM (default 32)"},
      {"NF4FLASH_Q4_SKINNY_KERNEL", "auto|mma|wgmma", "the skinny 4-bit GEMM at 17..32 rows: wgmma where it runs (compute capability 9.0), or as named (default auto)"},
      {"NF4FLASH_Q4GEMM_FUSED_MAX_ROWS", "0..1048576", "rows up to which auto takes the fused GEMM (default 512)"},
      {"NF4FLASH_DEQUANT_CHUNK_MB", "0..4096", "dequantize + cuBLAS in row chunks of this size, 0: whole (default 32)"},
      {"NF4FLASH_FLASH_KERNEL", "auto|mma|wgmma", "the prompt flash-attention kernel (default auto)"},
      {"NF4FLASH_CUDA_STACK_BYTES", "0..1048576", "per-thread stack limit of the CUDA context (default 0)"},
      {"NF4FLASH_VRAM_TRACE", "0|1", "device memory in use after each setup step, on stderr (default 0)"},
      {"NF4FLASH_DECODE_PIPELINE", "0|1", "queue the next decode step before the sampled id reaches the host "
                                          "(default 1 on CUDA, 0 on the CPU)"},
      {"NF4FLASH_TP_TIMEOUT", "seconds > 0", "how long a tensor-parallel rank waits for the others to connect (default 120)"},
      {"NF4FLASH_TP_PARENT", "a process id", "set by --tp in the ranks it starts: the rank 0 they end with (not set by hand)"},
  };
  return s;
}

std::vector<std::string> check_env_settings() {
  (void)cuda_tuning_from_env();
  (void)decode_pipeline_from_env();
  (void)tp_settings_from_env();
  std::vector<std::string> warnings;
  for (char** e = environ; e && *e; ++e) {
    const char* kv = *e;
    if (std::strncmp(kv, "NF4FLASH_", 9) != 0) continue;
    const char* eq = std::strchr(kv, '=');
    const std::string name(kv, eq ? size_t(eq - kv) : std::strlen(kv));
    bool known = false;
    for (const EnvSetting& s : env_settings()) known = known || name == s.name;
    if (!known) {
      std::string list;
      for (const EnvSetting& s : env_settings()) list += cat(list.empty() ? "" : ", ", s.name);
      warnings.push_back(cat(name, " is not a setting of this nf4flash and has no effect (settings: ", list, ")"));
    }
  }
  return warnings;
}

}  // namespace nf4flash
