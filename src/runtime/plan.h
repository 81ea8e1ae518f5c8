// Turning user options + a model config into the concrete plan that runs: device, compute dtype,
// quantization, attention path. Every conflict is an error naming the flag; nothing falls back.
#pragma once
#include <optional>

#include "backend/backend.h"
#include "io/hf_config.h"
#include "model/decoder.h"
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
// How the plan's weights are stored on its device: 4-bit as planned, dense ones in the compute
// dtype on CUDA and in f32 or bf16 on the CPU.
WeightPolicy weight_policy(const Plan& p, const LoadOptions& o);

// Prompt rows per prefill chunk: the option when given, else 4096 on CUDA (the 4-bit prefill path
// dequantizes every weight once per chunk, so long prompts want few chunks; the activations of
// 4096 rows of an 8B model are ~420 MB) and 512 on the CPU.
constexpr int64_t kCudaDefaultUbatch = 4096, kCpuDefaultUbatch = 512;
inline int64_t resolve_ubatch(int64_t ubatch, Device d) {
  return ubatch > 0 ? ubatch : (d == Device::CUDA ? kCudaDefaultUbatch : kCpuDefaultUbatch);
}

// Whether decode steps are queued ahead of the host (Engine::Impl::pipeline): the backend's
// default (Backend::pipelines_decode), overridden by NF4FLASH_DECODE_PIPELINE=0|1 (any other value
// is an error).
bool resolve_decode_pipeline(const Backend& be);
// NF4FLASH_DECODE_PIPELINE when set (throws Error naming it when invalid).
std::optional<bool> decode_pipeline_from_env();

// The bitsandbytes settings of a pre-quantized checkpoint (config.json quantization_config).
struct CheckpointQuant {
  bool present = false;
  QuantType type = QuantType::None;
  bool double_quant = false;
  DType compute = DType::BF16;
};
CheckpointQuant checkpoint_quant(const ModelConfig& cfg);

}  // namespace nf4flash
