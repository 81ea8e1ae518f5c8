// bitsandbytes code books and the scalar nearest-code decisions, reproduced exactly.
//
// 4-bit (16 entries, index = the 4-bit code):
//   nf4_code()/fp4_code(): what bitsandbytes.functional.get_4bit_type() returns (float32), i.e. the
//     `quant_map` tensor saved in checkpoints. FP4 is [0, .0625, 8, 12, 4, 6, 2, 3, then the same
//     negated] / 12; its entry 8 is +0.0 (Python's `-0` is the integer 0).
//   dequant_table4(): the values bitsandbytes' CUDA dequantize kernel multiplies by absmax
//     (dDequantizeNF4 / dDequantizeFP4Tree). Identical to the code books except FP4 entry 8, which
//     is -0.0 there (so a dequantized "negative zero" keeps its sign, as bnb's bf16 output does).
//   quantize_nf4(x)/quantize_fp4(x): bnb's dQuantizeNF4 / dQuantizeFP4 decision trees with their
//     exact float thresholds; x is the already-normalized value (element * (1/absmax)). NaN (the
//     0 * inf of an all-zero block) falls through every comparison to code 0, as on the GPU.
// 8-bit (256 entries, sorted ascending):
//   dynamic_map_signed(): create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8), the
//     nested code of double quantization, regenerated with torch's float32 arithmetic.
//   quantize_dynamic8(code, x): bnb's dQuantize<0> (7-step binary search from pivot 127, then the
//     midpoint rule with its exact tie-breaking).
// Reciprocal:
//   bnb_reciprocal(a): the kernels' `1.0f / absmax`. bitsandbytes is built with --use_fast_math, so
//     this is the GPU's approximate reciprocal (rcp.approx.ftz), not a correctly rounded division.
//     For a bf16-representable absmax (all absmax of bf16 weights) only the 7-bit mantissa matters;
//     of the 128 mantissas, 34 can change a 4-bit code of some bf16 input by one ulp of 1/absmax
//     (all FP4 thresholds; NF4 never), and bnb's outputs pin the hardware result for all 34: it is
//     the correctly rounded 1/a except for mantissas 132, 150 (one ulp lower) and 141, 246 (one ulp
//     higher) [of 128..255]. Other absmax values use the correctly rounded 1.0f / a, which can
//     differ from the GPU by one ulp (so f32/f16 weights may, rarely, get a neighbouring code when
//     an element lies within an ulp of a threshold). A zero or subnormal absmax gives +inf (ftz).
#pragma once
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "quant/quant4.h"

namespace nf4flash {

const std::array<float, 16>& nf4_code();
const std::array<float, 16>& fp4_code();
const std::array<float, 16>& code4(QuantType t);           // nf4_code or fp4_code; throws otherwise
const std::array<float, 16>& dequant_table4(QuantType t);  // see header comment

uint8_t quantize_nf4(float x);
uint8_t quantize_fp4(float x);
inline uint8_t quantize4(QuantType t, float x) {
  return t == QuantType::NF4 ? quantize_nf4(x) : quantize_fp4(x);
}

float bnb_reciprocal(float a);
// x * inv as the fast-math kernels form it: subnormal operands and results flushed to zero.
inline float bnb_mul_ftz(float x, float inv) {
  if (std::fabs(x) < FLT_MIN) x = 0.0f;
  const float y = x * inv;
  return std::fabs(y) < FLT_MIN ? 0.0f : y;
}

const std::array<float, 256>& dynamic_map_signed();
uint8_t quantize_dynamic8(const std::array<float, 256>& code, float x);

}  // namespace nf4flash
