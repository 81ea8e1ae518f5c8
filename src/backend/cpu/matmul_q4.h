// CPU fused dequantizing matmul for bitsandbytes 4-bit weights (NF4/FP4, plain or double quant).
//
//   y[m, rows] = x[m, cols] · Wᵀ, W = the dequantized [rows, cols] weight of `w`,
//   all row-major float32, y overwritten.
// Weight element i (flat, row-major) is table[code_i] * absmax(i / blocksize) in float32, exactly as
// bitsandbytes dequantizes it (quant/blockwise.h); with round_weights_bf16 it is then rounded to
// the nearest bf16 value, as bitsandbytes' bf16 compute path dequantizes to bf16 before its GEMM.
// Accumulation is float32 (FMA), so results match a dequantize + naive matmul to rounding only.
//
// No full-size copy of W is made. m <= 4: weights are decoded in registers (a per-block 16-entry
// LUT of code * absmax) and multiplied straight in. m > 4: each thread dequantizes 4 weight rows
// at a time into a small buffer (4 * cols floats) and multiplies them with a tile of up to 64 x
// rows, so every weight block is dequantized once per x tile. Threads split the weight rows (thread_pool()). AVX2/FMA
// when compiled with it, scalar otherwise. Blocks may span rows (cols % blocksize != 0) and cols
// may be odd. Double-quant absmax is expanded block by block as it is used (exactly, no FMA)
// unless w.absmax_f32 is filled by quant4_prepare (num_blocks floats: 1/8 of the packed size at
// blocksize 64; not needed for speed, measured within noise).
#pragma once
#include <cstdint>

#include "quant/quant4.h"

namespace nf4flash {

void cpu_matmul_q4(const float* x, int64_t m, const Quant4Tensor& w, float* y,
                   bool round_weights_bf16 = false);

}  // namespace nf4flash
