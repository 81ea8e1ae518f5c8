#include "model/weight_loader.h"

#include <cstring>

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

// A cut of a 4-bit weight as a weight of its own (the whole one when there is no cut).
Quant4Tensor cut_quant4(Quant4Tensor q, const std::string& name, const WeightCut& cut) {
  try {
    if (cut.axis == WeightCut::Axis::Rows) return quant4_rows(q, cut.begin, cut.n);
    if (cut.axis == WeightCut::Axis::Cols) return quant4_cols(q, cut.begin, cut.n);
  } catch (const Error& e) {
    fail("tensor ", name, ": ", e.what());
  }
  return q;
}

}  // namespace

// A dense [rows, cols] tensor's cut as a tensor of its own; `keep` holds the bytes of a column
// cut (a row cut is a view of the checkpoint).
TensorInfo cut_dense(const TensorInfo& t, int64_t rows, int64_t cols, const WeightCut& cut, std::vector<uint8_t>& keep) {
  if (cut.axis == WeightCut::Axis::None) return t;
  const size_t es = dtype_size(t.dtype);
  TensorInfo part = t;
  if (cut.axis == WeightCut::Axis::Rows) {
    NF4FLASH_CHECK(cut.begin >= 0 && cut.begin + cut.n <= rows, "tensor ", t.name, ": rows out of range");
    part.shape = {cut.n, cols};
    part.data = t.data + size_t(cut.begin * cols) * es;
  } else {
    NF4FLASH_CHECK(cut.begin >= 0 && cut.begin + cut.n <= cols, "tensor ", t.name, ": columns out of range");
    keep.resize(size_t(rows * cut.n) * es);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(keep.data() + size_t(r * cut.n) * es, t.data + size_t(r * cols + cut.begin) * es, size_t(cut.n) * es);
    part.shape = {rows, cut.n};
    part.data = keep.data();
  }
  part.nbytes = size_t(part.shape[0] * part.shape[1]) * es;
  return part;
}

std::unique_ptr<Weight> load_linear_weight(Backend& be, const WeightStore& store, const std::string& name,
                                           int64_t rows, int64_t cols, const WeightPolicy& p, bool allow_quant,
                                           const WeightCut& cut) {
  const TensorInfo& t = store.get(name);
  std::unique_ptr<Weight> w;
  if (t.dtype == DType::U8) {
    w = be.upload_quant4(std::make_shared<Quant4Tensor>(cut_quant4(read_packed(store, t, name, rows, cols, p), name, cut)));
  } else {
    check_dense_shape(t, name, rows, cols);
    if (allow_quant && p.quant != QuantType::None && !p.prequantized) {
      w = be.upload_quant4(std::make_shared<Quant4Tensor>(
          cut_quant4(quantize_4bit(t.data, t.dtype, rows, cols, quant_options(p)), name, cut)));
    } else {
      std::vector<uint8_t> keep;
      w = be.upload_dense(cut_dense(t, rows, cols, cut, keep), p.dense_store);
    }
  }
  store.release(name);
  return w;
}

// Rows [row0, row0 + n) of a 4-bit weight as a weight of their own, blocks not crossing the cut.
// Double-quant absmax is expanded to its f32 values (exact: the same arithmetic as dequantizing),
// since a cut need not fall on a nested block.
namespace {
// A cut's tensor: q's type, code book and blocksize at [rows, cols], no data yet (absmax f32).
Quant4Tensor cut_of(const Quant4Tensor& q, int64_t rows, int64_t cols) {
  Quant4Tensor out;
  out.type = q.type;
  out.rows = rows;
  out.cols = cols;
  out.blocksize = q.blocksize;
  out.orig_dtype = q.orig_dtype;
  out.code = q.code;
  return out;
}
}  // namespace

Quant4Tensor quant4_rows(const Quant4Tensor& q, int64_t row0, int64_t n) {
  const int64_t b0 = row0 * q.cols, b1 = (row0 + n) * q.cols;
  if (q.cols % 2 || b0 % q.blocksize || b1 % q.blocksize)
    fail("4-bit weight [", q.rows, ", ", q.cols, "] with blocksize ", q.blocksize, ": rows ", row0, "..",
         row0 + n, " do not start and end on a block");
  Quant4Tensor out = cut_of(q, n, q.cols);
  out.packed.assign(q.packed.begin() + b0 / 2, q.packed.begin() + b1 / 2);
  for (int64_t b = b0 / q.blocksize; b < b1 / q.blocksize; ++b) out.absmax.push_back(q.block_absmax(b));
  return out;
}

Quant4Tensor quant4_cols(const Quant4Tensor& q, int64_t col0, int64_t n) {
  const int64_t bs = q.blocksize;
  if (q.cols % bs || col0 % bs || n % bs || col0 < 0 || n <= 0 || col0 + n > q.cols)
    fail("4-bit weight [", q.rows, ", ", q.cols, "] with blocksize ", bs, ": columns ", col0, "..", col0 + n - 1,
         " do not start and end on a block");
  Quant4Tensor out = cut_of(q, q.rows, n);
  out.packed.reserve(size_t(q.rows * n / 2));
  out.absmax.reserve(size_t(q.rows * n / bs));
  for (int64_t r = 0; r < q.rows; ++r) {
    const int64_t e0 = r * q.cols + col0;
    out.packed.insert(out.packed.end(), q.packed.begin() + e0 / 2, q.packed.begin() + (e0 + n) / 2);
    for (int64_t b = e0 / bs; b < (e0 + n) / bs; ++b) out.absmax.push_back(q.block_absmax(b));
  }
  return out;
}

std::vector<std::unique_ptr<Weight>> load_fused_linear(Backend& be, const WeightStore& store, const std::string& name,
                                                       const std::vector<int64_t>& part_rows, int64_t cols,
                                                       const WeightPolicy& p, const std::vector<WeightCut>& cuts) {
  const TensorInfo& t = store.get(name);
  NF4FLASH_CHECK(cuts.empty() || cuts.size() == part_rows.size(), "load_fused_linear: one cut per part");
  int64_t rows = 0;
  for (int64_t r : part_rows) rows += r;
  if (t.dtype != DType::U8) check_dense_shape(t, name, rows, cols);
  // the rows each part keeps, in the fused tensor
  std::vector<WeightCut> keep;
  int64_t row0 = 0;
  for (size_t i = 0; i < part_rows.size(); ++i) {
    const WeightCut c = cuts.empty() ? WeightCut::rows(0, part_rows[i]) : cuts[i];
    NF4FLASH_CHECK(c.axis == WeightCut::Axis::Rows && c.begin >= 0 && c.begin + c.n <= part_rows[i],
                   "load_fused_linear: ", name, " part ", i, " cut out of range");
    keep.push_back(WeightCut::rows(row0 + c.begin, c.n));
    row0 += part_rows[i];
  }
  std::vector<std::unique_ptr<Weight>> out;
  if (t.dtype == DType::U8 || (p.quant != QuantType::None && !p.prequantized)) {
    // 4-bit: the whole tensor quantized (on load, or by bitsandbytes: it quantizes the fused
    // Linear) and cut into rows on block boundaries
    const Quant4Tensor q = t.dtype == DType::U8 ? read_packed(store, t, name, rows, cols, p)
                                                : quantize_4bit(t.data, t.dtype, rows, cols, quant_options(p));
    for (const WeightCut& c : keep) out.push_back(be.upload_quant4(std::make_shared<Quant4Tensor>(cut_quant4(q, name, c))));
  } else {
    std::vector<uint8_t> unused;
    for (const WeightCut& c : keep) out.push_back(be.upload_dense(cut_dense(t, rows, cols, c, unused), p.dense_store));
  }
  store.release(name);
  return out;
}

}  // namespace nf4flash
