// The NF4FLASH_* environment settings through the CLI: every setting with a value outside its
// range is one error line naming the variable and a non-zero exit, on the CPU too (the settings
// are checked before any subcommand runs); valid values are accepted; a name that is no setting
// is a warning naming it. And cuda_tuning_from_env's parsing of each value into CudaTuning.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/cuda_tuning.h"
#include "core/error.h"
#include "runtime/env_settings.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

const std::string kRun = "run --model " + model_dir("llama-gqa-hd64") +
                         " --device cpu --prompt-tokens 1,2,3 --max-new-tokens 1";

TEST(CliEnvSettings, EveryInvalidSettingIsAnErrorNamingIt) {
  const CliResult base = run_cli(kRun);
  ASSERT_EQ(base.code, 0) << base.err;
  for (const EnvSetting& s : env_settings()) {
    const CliResult r = run_cli(kRun, "", cat(s.name, "=garbage"));
    EXPECT_NE(r.code, 0) << s.name << ": " << r.err;
    EXPECT_EQ(r.err.rfind(cat("error: ", s.name, "=garbage"), 0), 0u) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
  }
}

TEST(CliEnvSettings, ValidValuesAreAcceptedAndUnknownNamesWarned) {
  const CliResult ok = run_cli(kRun, "",
                               "NF4FLASH_PDL=0 NF4FLASH_GEMV_MAX_ROWS=16 NF4FLASH_Q4_GEMM=dequant "
                               "NF4FLASH_FLASH_KERNEL=mma NF4FLASH_DECODE_PIPELINE=1");
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(ok.err.find("warning"), std::string::npos) << ok.err;
  const CliResult retired = run_cli(kRun, "", "NF4FLASH_GEMV_SEQ_CFG=h8u4d3");
  EXPECT_EQ(retired.code, 0) << retired.err;
  EXPECT_NE(retired.err.find("warning: NF4FLASH_GEMV_SEQ_CFG is not a setting"), std::string::npos) << retired.err;
}

// The environment is the input under test here; the variables are restored after each case.
struct EnvVar {
  std::string name;
  explicit EnvVar(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~EnvVar() { unsetenv(name.c_str()); }
};

TEST(CudaTuningFromEnv, ParsesEveryField) {
  const CudaTuning d = cuda_tuning_from_env();
  EXPECT_TRUE(d.pdl);
  EXPECT_EQ(d.gemv_max_rows, 8);
  EXPECT_EQ(d.q4_skinny_max_rows, 32);
  EXPECT_EQ(d.q4_skinny_kernel, SkinnyKernelChoice::Auto);
  EXPECT_EQ(d.q4_gemm, Q4GemmMode::Auto);
  EXPECT_EQ(d.q4_fused_max_rows, 512);
  EXPECT_EQ(d.dequant_chunk_mb, 32);
  EXPECT_EQ(d.flash_kernel, FlashKernelChoice::Auto);
  EXPECT_EQ(d.stack_bytes, 0);
  EXPECT_FALSE(d.vram_trace);
  {
    EnvVar a("NF4FLASH_PDL", "0"), b("NF4FLASH_GEMV_MAX_ROWS", "16"), c("NF4FLASH_Q4_GEMM", "fused"),
        e("NF4FLASH_Q4GEMM_FUSED_MAX_ROWS", "1024"), f("NF4FLASH_DEQUANT_CHUNK_MB", "0"),
        g("NF4FLASH_FLASH_KERNEL", "wgmma"), h("NF4FLASH_CUDA_STACK_BYTES", "256"), i("NF4FLASH_VRAM_TRACE", "1"),
        j("NF4FLASH_Q4_SKINNY_MAX_ROWS", "0"), k("NF4FLASH_Q4_SKINNY_KERNEL", "wgmma");
    const CudaTuning t = cuda_tuning_from_env();
    EXPECT_FALSE(t.pdl);
    EXPECT_EQ(t.gemv_max_rows, 16);
    EXPECT_EQ(t.q4_skinny_max_rows, 0);
    EXPECT_EQ(t.q4_skinny_kernel, SkinnyKernelChoice::Wgmma);
    EXPECT_EQ(t.q4_gemm, Q4GemmMode::Fused);
    EXPECT_EQ(t.q4_fused_max_rows, 1024);
    EXPECT_EQ(t.dequant_chunk_mb, 0);
    EXPECT_EQ(t.flash_kernel, FlashKernelChoice::Wgmma);
    EXPECT_EQ(t.stack_bytes, 256);
    EXPECT_TRUE(t.vram_trace);
  }
  for (auto [name, value] : {std::pair{"NF4FLASH_GEMV_MAX_ROWS", "257"}, {"NF4FLASH_GEMV_MAX_ROWS", "-1"},
                             {"NF4FLASH_GEMV_MAX_ROWS", "abc"}, {"NF4FLASH_GEMV_MAX_ROWS", "12x"},
                             {"NF4FLASH_PDL", "yes"}, {"NF4FLASH_Q4_GEMM", "FUSED"}, {"NF4FLASH_FLASH_KERNEL", "fa3"},
                             {"NF4FLASH_DEQUANT_CHUNK_MB", "4097"}, {"NF4FLASH_VRAM_TRACE", "2"},
                             {"NF4FLASH_Q4_SKINNY_MAX_ROWS", "65"}, {"NF4FLASH_Q4_SKINNY_MAX_ROWS", "-1"},
                             {"NF4FLASH_Q4_SKINNY_KERNEL", "WGMMA"}, {"NF4FLASH_Q4_SKINNY_KERNEL", "sm90"}}) {
    EnvVar v(name, value);
    try {
      cuda_tuning_from_env();
      ADD_FAILURE() << name << "=" << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cat(name, "=", value)), std::string::npos) << e.what();
    }
  }
}

TEST(CudaTuningFromEnv, ScopedOverrideNests) {
  EnvVar env("NF4FLASH_GEMV_MAX_ROWS", "4");
  EXPECT_EQ(cuda_tuning_current().gemv_max_rows, 4);
  {
    const ScopedCudaTuning outer(tuning_with([](CudaTuning& t) { t.gemv_max_rows = 16; }));
    EXPECT_EQ(cuda_tuning_current().gemv_max_rows, 16);
    {
      const ScopedCudaTuning inner(tuning_with([](CudaTuning& t) { t.gemv_max_rows = 0; }));
      EXPECT_EQ(cuda_tuning_current().gemv_max_rows, 0);
    }
    EXPECT_EQ(cuda_tuning_current().gemv_max_rows, 16);
  }
  EXPECT_EQ(cuda_tuning_current().gemv_max_rows, 4);
}

}  // namespace
