#include "model/weight_loader.h"

#include "core/error.h"
#include "io/bnb_checkpoint.h"
#include "io/safetensors.h"
#include "quant/blockwise.h"

namespace nf4flash {

std::unique_ptr<Weight> load_linear_weight(Backend& be, const WeightStore& store, const std::string& name,
                                           int64_t rows, int64_t cols, const WeightPolicy& p, bool allow_quant) {
  const TensorInfo& t = store.get(name);
  if (t.dtype == DType::U8) {  // bitsandbytes packed 4-bit
    if (!p.prequantized)
      fail(t.file, ": tensor ", name, " is packed 4-bit but config.json has no bitsandbytes quantization_config");
    auto q = std::make_shared<Quant4Tensor>(read_bnb_weight(store, name));
    if (q->rows != rows || q->cols != cols)
      fail(t.file, ": tensor ", name, " quant_state shape [", q->rows, ", ", q->cols, "], expected [", rows, ", ", cols, "]");
    auto w = be.upload_quant4(std::move(q));
    store.release(name);
    return w;
  }
  if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
    fail(t.file, ": tensor ", name, " has shape ", t.shape_str(), ", expected [", rows, ", ", cols, "]");
  auto w = upload_dense_linear(be, t, p, allow_quant);
  store.release(name);
  return w;
}

std::unique_ptr<Weight> upload_dense_linear(Backend& be, const TensorInfo& t, const WeightPolicy& p, bool allow_quant) {
  if (allow_quant && p.quant != QuantType::None && !p.prequantized) {
    Quant4Options o;
    o.type = p.quant;
    o.blocksize = p.blocksize;
    o.double_quant = p.double_quant;
    return be.upload_quant4(std::make_shared<Quant4Tensor>(quantize_4bit(t.data, t.dtype, t.shape[0], t.shape[1], o)));
  }
  return be.upload_dense(t, p.dense_store);
}

std::vector<std::unique_ptr<Weight>> load_fused_linear(Backend& be, const WeightStore& store, const std::string& name,
                                                       const std::vector<int64_t>& part_rows, int64_t cols,
                                                       const WeightPolicy& p) {
  const TensorInfo& t = store.get(name);
  int64_t rows = 0;
  for (int64_t r : part_rows) rows += r;
  if (t.dtype == DType::U8)
    fail(t.file, ": tensor ", name, " is a pre-quantized fused projection, which is not supported yet; load the "
         "bf16 checkpoint with --quant nf4 or fp4 instead");
  if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
    fail(t.file, ": tensor ", name, " has shape ", t.shape_str(), ", expected [", rows, ", ", cols, "]");
  std::vector<std::unique_ptr<Weight>> out;
  int64_t row0 = 0;
  for (int64_t r : part_rows) {
    TensorInfo part = t;
    part.shape = {r, cols};
    part.nbytes = static_cast<size_t>(r * cols) * dtype_size(t.dtype);
    part.data = t.data + static_cast<size_t>(row0 * cols) * dtype_size(t.dtype);
    out.push_back(upload_dense_linear(be, part, p, true));
    row0 += r;
  }
  store.release(name);
  return out;
}

}  // namespace nf4flash
