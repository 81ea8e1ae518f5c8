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
  if (allow_quant && p.quant != QuantType::None && !p.prequantized) {
    Quant4Options o;
    o.type = p.quant;
    o.blocksize = p.blocksize;
    o.double_quant = p.double_quant;
    auto q = std::make_shared<Quant4Tensor>(quantize_4bit(t.data, t.dtype, rows, cols, o));
    store.release(name);
    return be.upload_quant4(std::move(q));
  }
  auto w = be.upload_dense(t, p.dense_store);
  store.release(name);
  return w;
}

}  // namespace nf4flash
