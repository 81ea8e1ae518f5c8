// libFuzzer target: config.json parsing (both hub and transformers-5 spellings) and architecture
// resolution. Any input must parse or throw nf4flash::Error / a JSON parse error; never crash.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/hf_config.h"
#include "model/arch.h"
#include "model/rope.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  try {
    const nf4flash::ModelConfig c = nf4flash::parse_model_config(j, "fuzz/config.json");
    nf4flash::resolve_arch(c);
    if (c.head_dim <= 4096) (void)nf4flash::rope_inv_freq(c.rope, c.head_dim);
  } catch (const nf4flash::Error&) {
  }
  return 0;
}
