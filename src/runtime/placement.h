// Placement of a model's layers between the GPU and the CPU backend (--gpu-layers, --max-vram):
// the resident bytes of each part under a plan, and how many of the first layers the GPU holds.
// The embeddings, final norm and lm_head stay on the GPU; each layer's KV cache lives where the
// layer runs (f32 on the CPU backend, the compute dtype on the GPU).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "nf4flash/options.h"
#include "runtime/plan.h"

namespace nf4flash {

// "12GiB", "10GB", "512MiB", "1.5G", "4096" (bytes). Binary units for K/M/G/T with or without "iB"
// (as llama.cpp and the Linux tools read them), decimal for "KB"/"MB"/"GB"/"TB" (as transformers'
// max_memory does). Anything else is an error naming `flag`.
size_t parse_size(const std::string& flag, const std::string& text);
// "all" | "auto" | N (0..n): kAllLayers, kAutoLayers or N; else an error naming --gpu-layers.
int parse_gpu_layers(const std::string& text);
std::string gpu_layers_name(int gpu_layers);  // "all" | "auto" | "N"

// Resident bytes of `tensors` 4-bit weights with `n` parameters in all (bitsandbytes layout):
// packed codes, absmax (f32, or u8 codes with an f32 nested absmax per 256 blocks), and each
// tensor's code table (16 f32; double quant: also its 256-entry nested code table).
size_t quant4_bytes(size_t n, int blocksize, bool double_quant, size_t tensors);

// Bytes of a model's parts under a plan (an estimate from the config: the loaders' layouts).
struct ModelBytes {
  size_t embed = 0, head = 0, final_norm = 0;  // head: 0 when tied to the embeddings
  std::vector<size_t> layer;                   // each layer's weights
  // what a decode token reads of each layer: its weights, but of a mixture only the top-k experts
  std::vector<size_t> layer_read;
  std::vector<size_t> layer_params;            // each layer's linear parameters (for FLOPs)
  size_t head_params = 0;                      // lm_head's (tied or not)
  bool head_quant4 = false;                    // lm_head stored in 4 bits (--quant-lm-head)
  size_t kv_token_layer = 0;                   // K+V of one token in one layer, on the plan's device
  size_t kv_token_layer_host = 0;              // the same on the CPU backend (f32)
  size_t workspace = 0;                        // activations of a ubatch-row forward and its logits
  size_t weights() const;                      // all of them
};
ModelBytes model_bytes(const ModelConfig& cfg, const Plan& plan, const LoadOptions& o);

// GPU memory kept free of the plan for the CUDA context's own allocations (cuBLAS workspace,
// graphs, sampling buffers) and allocator slack.
constexpr size_t kGpuReserveBytes = size_t(768) << 20;
// The default --max-vram when placing layers: the GPU's free memory less this.
constexpr size_t kFreeMemoryMargin = size_t(1) << 30;
// The context a placed model plans its KV cache for when --ctx-size is not given.
constexpr int64_t kPlacedDefaultCtx = 8192;

struct Placement {
  int n_layers = 0, gpu_layers = 0;  // layers [0, gpu_layers) on the GPU
  int64_t ctx = 0;                   // the KV cache's capacity the plan holds
  size_t budget = 0;                 // bytes the GPU part may take (0: not limited)
  size_t gpu_fixed = 0;              // embeddings, final norm, lm_head, workspace, reserve
  size_t gpu_weights = 0, cpu_weights = 0;  // layer weights per device (gpu_weights excludes gpu_fixed)
  size_t gpu_kv = 0, cpu_kv = 0;
  bool offloaded() const { return gpu_layers < n_layers; }
  size_t gpu_total() const { return gpu_fixed + gpu_weights + gpu_kv; }
};

// The split for `requested` (kAllLayers, kAutoLayers or N) under `budget` bytes (0: unlimited;
// `budget_text` names where the budget came from in errors, e.g. "--max-vram 10GiB").
// kAllLayers and N must fit the budget; kAutoLayers takes the most layers that fit, at least one.
Placement place_layers(const ModelBytes& m, int64_t ctx, int requested, size_t budget, const std::string& budget_text);

}  // namespace nf4flash
