#include "runtime/plan.h"

#include <cstdlib>
#include <string_view>

#include "core/error.h"
#include "io/bnb_checkpoint.h"

namespace nf4flash {

CheckpointQuant checkpoint_quant(const ModelConfig& cfg) {
  CheckpointQuant q;
  if (cfg.quantization_config.is_null()) return q;
  try {
    const BnbQuantConfig b = parse_bnb_quant_config(cfg.quantization_config);
    if (!b.load_in_4bit) fail("quantization_config is not a bitsandbytes 4-bit config");
    q.present = true;
    q.type = b.quant_type;
    q.double_quant = b.double_quant;
    q.compute = b.compute_dtype;
  } catch (const Error& e) {
    fail(cfg.source, ": ", e.what());
  }
  return q;
}

Plan make_plan(const LoadOptions& o, const ModelConfig& cfg) {
  Plan p;
  switch (o.device) {
    case DeviceChoice::CPU: p.device = Device::CPU; break;
    case DeviceChoice::CUDA:
      if (cuda_device_count() == 0)
        fail("--device cuda: no usable CUDA device", cuda_device_count() == 0 ? " (none found, or built without CUDA)" : "");
      p.device = Device::CUDA;
      break;
    case DeviceChoice::Auto: p.device = cuda_device_count() > 0 ? Device::CUDA : Device::CPU; break;
  }
  switch (o.compute) {
    case ComputeDType::Auto: p.compute = DType::BF16; break;
    case ComputeDType::F32: p.compute = DType::F32; break;
    case ComputeDType::BF16: p.compute = DType::BF16; break;
    case ComputeDType::F16: p.compute = DType::F16; break;
  }
  if (o.tf32 && p.compute != DType::F32) fail("--tf32 on only affects --compute-dtype f32");
  if (o.blocksize < 32 || o.blocksize > 4096 || (o.blocksize & (o.blocksize - 1)) != 0)
    fail("--blocksize ", o.blocksize, ": must be a power of two from 32 to 4096");

  const CheckpointQuant cq = checkpoint_quant(cfg);
  if (cq.present) {
    p.prequantized = true;
    p.quant = cq.type;
    p.double_quant = cq.double_quant;
    const char* have = cq.type == QuantType::NF4 ? "nf4" : "fp4";
    if (o.quant == QuantChoice::None)
      fail("--quant none: the checkpoint is pre-quantized bitsandbytes ", have, "; omit --quant to load it as is");
    if ((o.quant == QuantChoice::NF4 && cq.type != QuantType::NF4) || (o.quant == QuantChoice::FP4 && cq.type != QuantType::FP4))
      fail("--quant ", o.quant == QuantChoice::NF4 ? "nf4" : "fp4", ": the checkpoint is pre-quantized bitsandbytes ", have,
           "; omit --quant to load it as is");
    if (o.double_quant && !cq.double_quant)
      fail("--double-quant: the pre-quantized checkpoint was saved without double quantization");
    if (o.blocksize != 64) fail("--blocksize: a pre-quantized checkpoint carries its own blocksize");
  } else {
    switch (o.quant) {
      case QuantChoice::Auto:
      case QuantChoice::None: p.quant = QuantType::None; break;
      case QuantChoice::NF4: p.quant = QuantType::NF4; break;
      case QuantChoice::FP4: p.quant = QuantType::FP4; break;
    }
    if (o.double_quant && p.quant == QuantType::None) fail("--double-quant needs --quant nf4 or fp4");
    p.double_quant = o.double_quant;
  }
  if (o.quant_lm_head && p.quant == QuantType::None) fail("--quant-lm-head needs --quant nf4 or fp4");
  switch (o.attn) {
    case AttnChoice::Auto: p.attn = AttnImpl::Auto; break;
    case AttnChoice::Flash: p.attn = AttnImpl::Flash; break;
    case AttnChoice::Sdpa: p.attn = AttnImpl::Sdpa; break;
    case AttnChoice::Eager: p.attn = AttnImpl::Eager; break;
  }
  return p;
}

WeightPolicy weight_policy(const Plan& p, const LoadOptions& o) {
  WeightPolicy wp;
  wp.quant = p.quant;
  wp.double_quant = p.double_quant;
  wp.blocksize = o.blocksize;
  wp.quant_lm_head = o.quant_lm_head;
  wp.prequantized = p.prequantized;
  wp.dense_store = p.device == Device::CPU ? (p.compute == DType::F32 ? DType::F32 : DType::BF16) : p.compute;
  return wp;
}

std::optional<bool> decode_pipeline_from_env() {
  const char* v = std::getenv("NF4FLASH_DECODE_PIPELINE");
  if (!v || !*v) return std::nullopt;
  const std::string_view s(v);
  if (s != "0" && s != "1")
    fail("NF4FLASH_DECODE_PIPELINE=", s, ": expected 0 (one decode step per host round trip) or 1 (steps queued ahead)");
  return s == "1";
}

bool resolve_decode_pipeline(const Backend& be) {
  return decode_pipeline_from_env().value_or(be.pipelines_decode());
}

}  // namespace nf4flash
