// A bitsandbytes 4-bit weight on the host: NF4 or FP4 codes packed two per byte, blockwise absmax
// (plain float32, or double-quantized: 8-bit codes + nested float32 absmax + offset).
// Layout is exactly bitsandbytes' (see quant/blockwise.h for quantize/dequantize):
//   packed[i/2]: element i of the flattened row-major [rows, cols] weight; even i in the HIGH nibble.
//   block b covers flat elements [b*blocksize, (b+1)*blocksize).
//   absmax(b) = plain ? absmax[b] : nested_code[absmax_q[b]] * nested_absmax[b / nested_blocksize] + offset
//               (float32: the product is rounded before the offset is added, never an FMA)
//   value(i)  = code[nibble(i)] * absmax(i / blocksize)            (float32 arithmetic)
// absmax_f32 is an optional cache (not serialized) of the expanded double-quant absmax, filled by
// quant4_prepare() in quant/blockwise.h; the CPU matmul uses it when present.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace nf4flash {

enum class QuantType : uint8_t { None, NF4, FP4 };

std::string_view quant_type_name(QuantType t);  // "none", "nf4", "fp4"
bool quant_type_from_name(std::string_view s, QuantType* out);

struct Quant4Tensor {
  QuantType type = QuantType::NF4;
  int64_t rows = 0, cols = 0;  // logical shape [out_features, in_features]
  int blocksize = 64;
  DType orig_dtype = DType::BF16;  // dtype of the weight before quantization (quant_state "dtype")
  std::array<float, 16> code{};     // the 16-entry code book (quant_map)
  std::vector<uint8_t> packed;      // rows*cols/2 bytes

  // plain
  std::vector<float> absmax;  // one per block when !double_quant

  // double quant
  bool double_quant = false;
  std::vector<uint8_t> absmax_q;      // one 8-bit code per block
  std::vector<float> nested_absmax;   // one per nested block of absmax codes
  std::array<float, 256> nested_code{};  // signed dynamic map
  float offset = 0.0f;                // mean subtracted before nested quantization
  int nested_blocksize = 256;

  // Cache: expanded float absmax per block when double_quant (see quant4_prepare); else empty.
  std::vector<float> absmax_f32;

  int64_t numel() const { return rows * cols; }
  int64_t num_blocks() const { return (numel() + blocksize - 1) / blocksize; }
  float block_absmax(int64_t b) const {
    if (!double_quant) return absmax[b];
    if (!absmax_f32.empty()) return absmax_f32[b];
    // volatile: keep the product rounded to float (bitsandbytes adds the offset in a later kernel),
    // so -march=native cannot fuse it into an FMA.
    volatile float p = nested_code[absmax_q[b]] * nested_absmax[b / nested_blocksize];
    return p + offset;
  }
  // Bytes this weight occupies in memory (codes + absmax state).
  size_t resident_bytes() const {
    return packed.size() + absmax.size() * 4 + absmax_q.size() + nested_absmax.size() * 4 +
           (double_quant ? 256 * 4 : 0) + 16 * 4 + absmax_f32.size() * 4;
  }
};

}  // namespace nf4flash
