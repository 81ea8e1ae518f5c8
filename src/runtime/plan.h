// Turning user options + a model config into the concrete plan that runs: device, compute dtype,
// quantization, attention path. Every conflict is an error naming the flag; nothing falls back.
#pragma once
#include "backend/backend.h"
#include "io/hf_config.h"
#include "nf4flash/options.h"

namespace nf4flash {

struct Plan {
  Device device = Device::CPU;
  DType compute = DType::F32;
  QuantType quant = QuantType::None;
  bool double_quant = false;
  bool prequantized = false;
  AttnImpl attn = AttnImpl::Auto;
};

Plan make_plan(const LoadOptions& o, const ModelConfig& cfg);

// The bitsandbytes settings of a pre-quantized checkpoint (config.json quantization_config).
struct CheckpointQuant {
  bool present = false;
  QuantType type = QuantType::None;
  bool double_quant = false;
  DType compute = DType::BF16;
};
CheckpointQuant checkpoint_quant(const ModelConfig& cfg);

}  // namespace nf4flash
