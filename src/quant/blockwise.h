// Blockwise 4-bit quantization (NF4/FP4, optional double quant) and dequantization, bit-exact with
// bitsandbytes' CUDA kernels (kQuantizeBlockwise, kDequantizeBlockwise; bnb 0.50).
//
// Input: a row-major [rows, cols] weight in bf16, f16 or f32, flattened; block b covers flat
// elements [b*blocksize, (b+1)*blocksize) (the last block may be partial, and blocks may span rows).
// Per block, in float32:  absmax = max |x|;  inv = 1.0f / absmax;  code = dQuantize{NF4,FP4}(x * inv)
// (an all-zero block gives inv = inf, x * inv = NaN, code 0). bnb builds with --use_fast_math, so
// inv is the GPU's approximate reciprocal and subnormals flush: see codebook.h bnb_reciprocal. Packed output: element 2k in the high
// nibble of byte k, 2k+1 in the low nibble; an odd element count pads the last low nibble with the
// code of 0 * inv.
// Double quant: offset = mean(absmax) as torch computes it on the GPU: float(sum) * (1.0f / n)
// (a float32 multiply by the reciprocal, which is why the float64 mean is sometimes one ulp off;
// Quant4Options::offset overrides it), then (absmax - offset) is quantized blockwise
// (blocksize 256) to 8 bits with the signed dynamic map, absmax per nested block kept in float32.
// Dequantization: value = table[code] * absmax(b) in float32 (table = codebook.h dequant_table4),
// with the double-quant absmax expanded as (nested_code[q] * nested_absmax) + offset, two roundings.
// bf16 output rounds that float to nearest-even, as the bnb kernel's (T)(float) conversion does.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "quant/quant4.h"

namespace nf4flash {

// Blocksizes bitsandbytes' CUDA backend accepts for 4-bit: 32, 64, ..., 4096.
bool valid_blocksize_4bit(int blocksize);
void check_blocksize_4bit(int blocksize);  // throws Error naming the value and the allowed set

struct Quant4Options {
  QuantType type = QuantType::NF4;
  int blocksize = 64;
  bool double_quant = false;
  int nested_blocksize = 256;
  // Double-quant offset to use instead of our mean (e.g. a checkpoint's quant_state nested_offset,
  // to reproduce it exactly).
  std::optional<float> offset;
};

// Quantize a [rows, cols] weight (data in `dtype`: BF16, F16 or F32). Multithreaded over blocks.
Quant4Tensor quantize_4bit(const void* data, DType dtype, int64_t rows, int64_t cols,
                           const Quant4Options& opt);
Quant4Tensor quantize_4bit(const void* data, DType dtype, int64_t rows, int64_t cols,
                           QuantType type, int blocksize = 64, bool double_quant = false);

// Lower level, on flat arrays (what the two functions above are made of).
//   packed: (n + 1) / 2 bytes; absmax: ceil(n / blocksize) floats.
void quantize_blockwise_4bit(const void* data, DType dtype, int64_t n, QuantType type,
                             int blocksize, uint8_t* packed, float* absmax);
//   8-bit blockwise with a sorted 256-entry code (bnb quantize_blockwise): out n bytes,
//   absmax ceil(n / blocksize) floats.
void quantize_blockwise_8bit(const float* x, int64_t n, int blocksize,
                             const std::array<float, 256>& code, uint8_t* out, float* absmax);
// mean(absmax) as torch's float32 mean: float(sum) * (1.0f / n), the sum taken in float64.
float absmax_mean(const float* absmax, int64_t n);

// Checks the internal consistency of a Quant4Tensor (sizes vs shape and blocksizes, type);
// `what` names the tensor in the Error.
void validate_quant4(const Quant4Tensor& q, const std::string& what);

// Float absmax per block (double quant expanded as bitsandbytes does; plain: a copy).
std::vector<float> expand_absmax(const Quant4Tensor& q);
// Fill q.absmax_f32 for double-quant tensors (no-op for plain ones). Idempotent.
void quant4_prepare(Quant4Tensor& q);

// Dequantize to a [rows, cols] float32 / bf16 (bit patterns) buffer. Multithreaded.
void dequantize_4bit(const Quant4Tensor& q, float* out);
void dequantize_4bit_bf16(const Quant4Tensor& q, uint16_t* out);
// Dequantize flat elements [begin, begin + count) to float (optionally rounded to bf16 values).
// absmax: the expanded float absmax (expand_absmax), or nullptr to expand block by block.
void dequantize_4bit_range(const Quant4Tensor& q, const float* absmax, int64_t begin,
                           int64_t count, bool round_bf16, float* out);

}  // namespace nf4flash
