// doctor's placement section (on CUDA; on the CPU its prediction only): how --gpu-layers / --max-vram (or the default, every
// layer) splits the model, the rates measured now on this machine, the decode tok/s and TTFT they
// predict, and the fix when layers are offloaded or the model does not fit.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "io/hf_config.h"
#include "nf4flash/options.h"
#include "runtime/plan.h"

namespace nf4flash::cli {

struct PlacementCheck {
  nlohmann::json j;             // the "placement" object of doctor --json
  std::string error;            // the split asked for cannot be placed (the engine would refuse it)
  std::string warning, fix;     // layers offloaded (or not placeable): what it costs and what fixes it
  std::string summary;          // the lines doctor prints
};

// Measures the GPU backend's (and, when layers go to the CPU, the CPU backend's and the link's)
// rates: about a second. free_bytes: the GPU's free memory now; unplaced_ctx: the context the
// engine gives the KV cache without --gpu-layers / --max-vram.
// measure false: the placement alone, no rates and no prediction (doctor --no-load).
PlacementCheck check_placement(const LoadOptions& o, const ModelConfig& cfg, const Plan& plan, size_t free_bytes,
                               int64_t unplaced_ctx, bool measure);

// A plan on the CPU backend: its decode tok/s and TTFT predicted from the CPU backend's rates
// measured now (a few seconds for an 8B model's shapes).
PlacementCheck predict_cpu(const LoadOptions& o, const ModelConfig& cfg, const Plan& plan);

}  // namespace nf4flash::cli
