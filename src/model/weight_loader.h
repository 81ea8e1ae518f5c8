// Loading one linear weight onto a backend, whichever form it takes: dense in the checkpoint and
// kept dense, dense and quantized on load (bitsandbytes-exact), or pre-quantized bitsandbytes.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/decoder.h"

namespace nf4flash {

class WeightStore;

std::unique_ptr<Weight> load_linear_weight(Backend& be, const WeightStore& store, const std::string& name,
                                           int64_t rows, int64_t cols, const WeightPolicy& p, bool allow_quant);

// A fused projection (Phi-3's qkv_proj, gate_up_proj): a [sum(part_rows), cols] tensor whose
// consecutive row ranges become separate weights. 4-bit: the whole tensor is quantized (on load,
// as bitsandbytes quantizes the fused Linear, or read pre-quantized) and cut on block boundaries
// (quant4_rows); dense: the rows as they are.
Quant4Tensor quant4_rows(const Quant4Tensor& q, int64_t row0, int64_t n);
std::vector<std::unique_ptr<Weight>> load_fused_linear(Backend& be, const WeightStore& store, const std::string& name,
                                                       const std::vector<int64_t>& part_rows, int64_t cols,
                                                       const WeightPolicy& p);

}  // namespace nf4flash
