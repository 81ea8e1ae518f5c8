// Loading one linear weight onto a backend, whichever form it takes: dense in the checkpoint and
// kept dense, dense and quantized on load (bitsandbytes-exact), or pre-quantized bitsandbytes;
// whole, or one tensor-parallel rank's rows or columns of it (WeightCut).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/decoder.h"

namespace nf4flash {

class WeightStore;

// The part of a [rows, cols] weight a rank holds: all of it, rows [begin, begin + n) (a
// column-parallel linear: q/k/v, gate/up, lm_head) or columns [begin, begin + n) (a row-parallel
// linear: o_proj, down). A 4-bit weight is quantized whole (as bitsandbytes quantizes the
// unsharded Linear) or read whole, then cut on block boundaries: its values are those of the whole.
struct WeightCut {
  enum class Axis : uint8_t { None, Rows, Cols } axis = Axis::None;
  int64_t begin = 0, n = 0;
  static WeightCut rows(int64_t b, int64_t n) { return {Axis::Rows, b, n}; }
  static WeightCut cols(int64_t b, int64_t n) { return {Axis::Cols, b, n}; }
};

// A dense [rows, cols] tensor's cut as a tensor of its own (`t` unchanged for no cut); `keep`
// holds the bytes of a column cut (a row cut is a view of the checkpoint).
TensorInfo cut_dense(const TensorInfo& t, int64_t rows, int64_t cols, const WeightCut& cut, std::vector<uint8_t>& keep);

std::unique_ptr<Weight> load_linear_weight(Backend& be, const WeightStore& store, const std::string& name,
                                           int64_t rows, int64_t cols, const WeightPolicy& p, bool allow_quant,
                                           const WeightCut& cut = {});

// A fused projection (Phi-3's qkv_proj, gate_up_proj): a [sum(part_rows), cols] tensor whose
// consecutive row ranges become separate weights. 4-bit: the whole tensor is quantized (on load,
// as bitsandbytes quantizes the fused Linear, or read pre-quantized) and cut on block boundaries
// (quant4_rows); dense: the rows as they are. `cuts` (empty: whole parts) names, per part, the
// rows of that part to keep (WeightCut::rows, relative to the part's first row).
Quant4Tensor quant4_rows(const Quant4Tensor& q, int64_t row0, int64_t n);
// Columns [col0, col0 + n) of every row, blocks not crossing the cut (nor a row end).
Quant4Tensor quant4_cols(const Quant4Tensor& q, int64_t col0, int64_t n);
std::vector<std::unique_ptr<Weight>> load_fused_linear(Backend& be, const WeightStore& store, const std::string& name,
                                                       const std::vector<int64_t>& part_rows, int64_t cols,
                                                       const WeightPolicy& p, const std::vector<WeightCut>& cuts = {});

}  // namespace nf4flash
