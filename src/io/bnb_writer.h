// Writing bitsandbytes 4-bit checkpoints from a plain (bf16/f16/f32) Hugging Face model folder:
// what `nf4flash quantize` does, as transformers + bitsandbytes' save_pretrained lays it out.
//
//   model.safetensors   the decoder layers' linear weights (q/k/v/o/gate/up/down_proj .weight,
//                       lm_head too with quant_lm_head) as packed codes + absmax + quant_map (+ the
//                       double-quant tensors) + quant_state JSON; every other tensor (embeddings,
//                       norms, biases, lm_head) unchanged; metadata {"format": "pt"}.
//   config.json         the source's, spelled as transformers 5 writes it (torch_dtype -> dtype,
//                       rope_theta/rope_scaling -> rope_parameters), plus quantization_config.
//   generation_config.json and tokenizer files: copied as they are.
//
// The folder is written to OUT.tmp-XXXXXX next to OUT and renamed at the end; any failure removes
// the temporary folder, so OUT is either complete or untouched.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/dtype.h"
#include "quant/quant4.h"

namespace nf4flash {

struct QuantizeCheckpointOptions {
  std::string model_dir;  // source folder (config.json + model.safetensors or shards)
  std::string out_dir;    // destination folder
  QuantType quant = QuantType::NF4;
  bool double_quant = false;
  int blocksize = 64;
  DType compute_dtype = DType::BF16;  // bnb_4bit_compute_dtype written to config.json
  bool quant_lm_head = false;
  bool force = false;  // replace an existing non-empty out_dir
};

struct QuantizeCheckpointResult {
  size_t bytes_before = 0;  // tensor bytes of the source checkpoint
  size_t bytes_after = 0;   // tensor bytes written (all tensors of model.safetensors)
  size_t file_bytes = 0;    // size of the written model.safetensors
  int n_quantized = 0, n_plain = 0;
  std::vector<std::string> copied_files;  // besides model.safetensors and config.json
};

// (k, n, tensor name): called before quantizing weight k of n (1-based).
using QuantizeProgressFn = std::function<void(int, int, const std::string&)>;

// Throws Error (naming the flag, folder or tensor) for bad options, an already quantized source,
// an unknown architecture, unsupported dtypes, or an existing non-empty out_dir without force.
QuantizeCheckpointResult quantize_checkpoint(const QuantizeCheckpointOptions& opt,
                                             const QuantizeProgressFn& progress = nullptr);

// Is `name` one of the tensors transformers + bitsandbytes convert to 4-bit?
bool is_bnb_linear_weight_name(const std::string& name, bool quant_lm_head);

// config.json of the quantized checkpoint: `source` respelled as transformers 5 writes it
// (dtype, rope_parameters) with quantization_config added. weights_dtype: "dtype" when the
// source names none.
nlohmann::json bnb_checkpoint_config(const nlohmann::json& source, const QuantizeCheckpointOptions& opt,
                                     DType weights_dtype);
// json.dumps(config, indent=2, sort_keys=True) + "\n", as transformers writes config.json.
std::string hf_json_text(const nlohmann::json& j);

}  // namespace nf4flash
