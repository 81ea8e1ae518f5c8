// bitsandbytes 4-bit checkpoints as transformers saves them (load_in_4bit, save_pretrained).
//
// Tensors of one quantized weight W (e.g. "model.layers.0.self_attn.q_proj.weight"):
//   W                                    U8  [(numel + 1) / 2, 1]  packed codes, high nibble first
//   W.absmax                             F32 [num_blocks]          (plain)
//                                        U8  [num_blocks]          (double quant: 8-bit codes)
//   W.quant_map                          F32 [16]                  the 4-bit code book
//   W.nested_absmax                      F32 [ceil(num_blocks / nested_blocksize)]   (double quant)
//   W.nested_quant_map                   F32 [256]                 signed dynamic map (double quant)
//   W.quant_state.bitsandbytes__{nf4|fp4} U8 [len]                 UTF-8 JSON, e.g.
//     {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [128, 256],
//      "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0971217155456543}
//     (Python json.dumps spelling: ", " and ": " separators, floats as Python's repr).
// config.json carries "quantization_config" with quant_method "bitsandbytes" (see BnbQuantConfig).
// Files are written with tensors ordered as the safetensors Python writer does: by element size,
// largest first, then by name.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "quant/quant4.h"

namespace nf4flash {

// config.json "quantization_config" for bitsandbytes.
struct BnbQuantConfig {
  bool load_in_4bit = false;
  bool load_in_8bit = false;
  QuantType quant_type = QuantType::FP4;  // bnb_4bit_quant_type (transformers' default: fp4)
  bool double_quant = false;              // bnb_4bit_use_double_quant
  DType compute_dtype = DType::F32;       // bnb_4bit_compute_dtype (null: float32)
  DType quant_storage = DType::U8;        // bnb_4bit_quant_storage
  int blocksize = 64;                     // not written by transformers; "bnb_4bit_blocksize" if present
  std::vector<std::string> skip_modules;  // llm_int8_skip_modules (null: none listed)
};

// True when config.json (the whole object) has a quantization_config with quant_method
// "bitsandbytes".
bool has_bnb_quant_config(const nlohmann::json& config);
// Parses config["quantization_config"] (or, if `config` has no such key, `config` itself).
// Throws Error for a non-bitsandbytes method, 8-bit checkpoints, unknown quant type or dtype.
BnbQuantConfig parse_bnb_quant_config(const nlohmann::json& config);
// The quantization_config object exactly as transformers 5 writes it for load_in_4bit.
nlohmann::json bnb_quant_config_json(QuantType type, bool double_quant, DType compute_dtype,
                                     const std::vector<std::string>& skip_modules = {});

// Does the store hold a bitsandbytes 4-bit weight named weight_name (its quant_state tensor)?
bool is_bnb_quantized(const WeightStore& ws, const std::string& weight_name);
// Reads and validates one 4-bit weight; every inconsistency is an Error naming the tensor.
Quant4Tensor read_bnb_weight(const WeightStore& ws, const std::string& weight_name);

// torch dtype names as quant_state spells them ("bfloat16", "float16", "float32").
std::string torch_dtype_name(DType t);
bool dtype_from_torch_name(const std::string& s, DType* out);
// Python's repr() of a float (shortest round-trip digits; "0.1", "1e-05", "6.0").
std::string python_float_repr(double v);
// The quant_state JSON bytes transformers writes for q.
std::string bnb_quant_state_json(const Quant4Tensor& q);

// Tensors to hand to write_safetensors for a bitsandbytes checkpoint: each quantized weight
// expands to its 5 or 6 tensors; `plain` tensors are passed through. Pointers refer to the
// Quant4Tensors, the plain tensors' data and `owned` (quant_state bytes): keep all of them alive
// until written.
struct BnbTensorSet {
  std::vector<TensorToWrite> tensors;  // in the safetensors Python writer's order
  std::deque<std::string> owned;
};
BnbTensorSet make_bnb_tensor_set(
    const std::vector<std::pair<std::string, const Quant4Tensor*>>& quantized,
    const std::vector<TensorToWrite>& plain);

}  // namespace nf4flash
