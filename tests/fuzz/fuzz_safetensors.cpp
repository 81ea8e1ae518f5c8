// libFuzzer target: the safetensors header parser and bounds checks. Any input must either load
// (every tensor inside the file) or throw nf4flash::Error; never crash, hang or read out of bounds.
// Build: cmake -DNF4FLASH_FUZZ=ON with CC=clang CXX=clang++ (target fuzz_safetensors), then
//   ./fuzz_safetensors -max_total_time=600 corpus/
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/nf4flash_fuzz_st_" + std::to_string(getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    nf4flash::SafetensorsFile st(path);
    uint64_t sum = 0;
    for (const auto& t : st.tensors())
      for (size_t i = 0; i < t.nbytes; i += 61) sum += t.data[i];  // touch the claimed bytes
    if (sum == 0xdeadbeef) std::printf(" ");
  } catch (const nf4flash::Error&) {
  }
  return 0;
}
