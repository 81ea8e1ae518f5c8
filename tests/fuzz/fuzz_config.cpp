// libFuzzer target: config.json parsing (both hub and transformers-5 spellings, RoPE scalings,
// mixture-of-experts and sliding-window fields) and architecture resolution. Any input must parse or throw nf4flash::Error / a JSON parse error; never crash.
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
    if (c.head_dim <= 4096) {
      (void)nf4flash::rope_inv_freq(c.rope, c.head_dim);
      if (c.rope.type == "longrope") (void)nf4flash::rope_inv_freq_long(c.rope, c.head_dim);
      if (c.rope.type == "dynamic") (void)nf4flash::rope_inv_freq_dynamic(c.rope, c.head_dim, c.max_positions + 1);
      if (c.has_local_rope) (void)nf4flash::rope_inv_freq(c.local_rope, c.head_dim);
    }
    for (int i = 0; i < c.n_layers && i < 4096; ++i) (void)c.moe.sparse(i);
  } catch (const nf4flash::Error&) {
  }
  return 0;
}
