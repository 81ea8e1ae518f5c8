// Loading one linear weight onto a backend, whichever form it takes: dense in the checkpoint and
// kept dense, dense and quantized on load (bitsandbytes-exact), or pre-quantized bitsandbytes.
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/decoder.h"

namespace nf4flash {

class WeightStore;

std::unique_ptr<Weight> load_linear_weight(Backend& be, const WeightStore& store, const std::string& name,
                                           int64_t rows, int64_t cols, const WeightPolicy& p, bool allow_quant);

}  // namespace nf4flash
