#include "model/weight_loader.h"

#include "core/error.h"
#include "io/bnb_checkpoint.h"
#include "io/safetensors.h"
#include "quant/blockwise.h"

namespace nf4flash {

namespace {

Quant4Options quant_options(const WeightPolicy& p) {
  Quant4Options o;
  o.type = p.quant;
  o.blocksize = p.blocksize;
  o.double_quant = p.double_quant;
  return o;
}

void check_dense_shape(const TensorInfo& t, const std::string& name, int64_t rows, int64_t cols) {
  if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
    fail(t.file, ": tensor ", name, " has shape ", t.shape_str(), ", expected [", rows, ", ", cols, "]");
}

// A bitsandbytes 4-bit tensor of the checkpoint, its quant_state shape checked.
Quant4Tensor read_packed(const WeightStore& store, const TensorInfo& t, const std::string& name, int64_t rows,
                         int64_t cols, const WeightPolicy& p) {
  if (!p.prequantized)
    fail(t.file, ": tensor ", name, " is packed 4-bit but config.json has no bitsandbytes quantization_config");
  Quant4Tensor q = read_bnb_weight(store, name);
  if (q.rows != rows || q.cols != cols)
    fail(t.file, ": tensor ", name, " quant_state shape [", q.rows, ", ", q.cols, "], expected [", rows, ", ", cols, "]");
  return q;
}

}  // namespace

std::unique_ptr<Weight> load_linear_weight(Backend& be, const WeightStore& store, const std::string& name,
                                           int64_t rows, int64_t cols, const WeightPolicy& p, bool allow_quant) {
  const TensorInfo& t = store.get(name);
  std::unique_ptr<Weight> w;
  if (t.dtype == DType::U8) {
    w = be.upload_quant4(std::make_shared<Quant4Tensor>(read_packed(store, t, name, rows, cols, p)));
  } else {
    check_dense_shape(t, name, rows, cols);
    if (allow_quant && p.quant != QuantType::None && !p.prequantized)
      w = be.upload_quant4(std::make_shared<Quant4Tensor>(quantize_4bit(t.data, t.dtype, rows, cols, quant_options(p))));
    else
      w = be.upload_dense(t, p.dense_store);
  }
  store.release(name);
  return w;
}

// Rows [row0, row0 + n) of a 4-bit weight as a weight of their own, blocks not crossing the cut.
// Double-quant absmax is expanded to its f32 values (exact: the same arithmetic as dequantizing),
// since a cut need not fall on a nested block.
Quant4Tensor quant4_rows(const Quant4Tensor& q, int64_t row0, int64_t n) {
  const int64_t b0 = row0 * q.cols, b1 = (row0 + n) * q.cols;
  if (q.cols % 2 || b0 % q.blocksize || b1 % q.blocksize)
    fail("4-bit fused projection [", q.rows, ", ", q.cols, "] with blocksize ", q.blocksize, ": rows ", row0, "..",
         row0 + n, " do not start and end on a block");
  Quant4Tensor out;
  out.type = q.type;
  out.rows = n;
  out.cols = q.cols;
  out.blocksize = q.blocksize;
  out.orig_dtype = q.orig_dtype;
  out.code = q.code;
  out.packed.assign(q.packed.begin() + b0 / 2, q.packed.begin() + b1 / 2);
  for (int64_t b = b0 / q.blocksize; b < b1 / q.blocksize; ++b) out.absmax.push_back(q.block_absmax(b));
  return out;
}

std::vector<std::unique_ptr<Weight>> load_fused_linear(Backend& be, const WeightStore& store, const std::string& name,
                                                       const std::vector<int64_t>& part_rows, int64_t cols,
                                                       const WeightPolicy& p) {
  const TensorInfo& t = store.get(name);
  int64_t rows = 0;
  for (int64_t r : part_rows) rows += r;
  if (t.dtype != DType::U8) check_dense_shape(t, name, rows, cols);
  std::vector<std::unique_ptr<Weight>> out;
  int64_t row0 = 0;
  if (t.dtype == DType::U8 || (p.quant != QuantType::None && !p.prequantized)) {
    // 4-bit: the whole tensor quantized (on load, or by bitsandbytes: it quantizes the fused
    // Linear) and cut into rows on block boundaries
    const Quant4Tensor q = t.dtype == DType::U8 ? read_packed(store, t, name, rows, cols, p)
                                                : quantize_4bit(t.data, t.dtype, rows, cols, quant_options(p));
    for (int64_t r : part_rows) {
      out.push_back(be.upload_quant4(std::make_shared<Quant4Tensor>(quant4_rows(q, row0, r))));
      row0 += r;
    }
  } else {
    for (int64_t r : part_rows) {
      TensorInfo part = t;
      part.shape = {r, cols};
      part.nbytes = static_cast<size_t>(r * cols) * dtype_size(t.dtype);
      part.data = t.data + static_cast<size_t>(row0 * cols) * dtype_size(t.dtype);
      out.push_back(be.upload_dense(part, p.dense_store));
      row0 += r;
    }
  }
  store.release(name);
  return out;
}

}  // namespace nf4flash
