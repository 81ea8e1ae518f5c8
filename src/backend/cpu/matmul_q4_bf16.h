// CPU 4-bit matmul over bf16 dot products: the CPU backend's fast path for bitsandbytes NF4/FP4
// weights with compute bf16 (AVX-512 BF16: vdpbf16ps, 16 rows x 2 elements per instruction).
//
//   y[m, rows] = x[m, cols] · Wᵀ   (x, y row-major float32, y overwritten)
//
// Weights, repacked once at load (Q4Panels; the bitsandbytes layout is not kept):
//   * rows in panels of 16 (the last one zero-padded), cols in chunks of C = min(64, blocksize)
//     elements, so one chunk of one row has one absmax;
//   * codes[panel][chunk][C/4 blocks][32 bytes]: byte 2r+e of block k holds, for row r of the
//     panel, the code of element 2k+e in its low nibble and of element 2(k + C/4)+e in its high
//     one (each nibble plane of a block decodes to one 16-row x 2-element vdpbf16ps operand);
//   * scales[panel][chunk][16]: absmax * 2^s as f16, s chosen per tensor so that the largest
//     lands in [2^14, 2^15) (no f16 overflow; relative precision 2^-11 down to 2^-14 of it);
//   * the code book as bf16 (round to nearest even).
// Activations are rounded to bf16 (as the CUDA bf16 path and transformers' bf16 compute hold
// them). Per output (j, r), for each chunk c in order: t = the chunk's dot product of bf16 codes
// and bf16 activations accumulated in f32 (pairs in vdpbf16ps order), acc = fma(t, scale[r][c],
// acc); y = acc * 2^-s. Every row of x takes the same operations whatever m is and whichever rows
// share a tile, so results do not depend on batching.
#pragma once
#include <cstdint>
#include <vector>

#include "quant/quant4.h"

namespace nf4flash {

struct Q4Panels {
  static constexpr int kPanelRows = 16;
  int64_t rows = 0, cols = 0, panels = 0;
  int chunk = 64;             // elements per chunk: min(64, blocksize)
  uint16_t table[16] = {};    // the code book as bf16
  float out_scale = 1.0f;     // 2^-s
  std::vector<uint8_t> codes;     // panels * chunks * chunk * 8 bytes
  std::vector<uint16_t> scales;   // panels * chunks * 16 (f16)

  int64_t chunks() const { return cols / chunk; }
  size_t resident_bytes() const { return codes.size() + scales.size() * 2; }
};

// Whether this build has the kernel (AVX-512 BW + BF16), and whether w has a shape it takes (cols
// a whole number of chunks).
bool q4_bf16_available();
bool q4_bf16_supported(const Quant4Tensor& w);

Q4Panels pack_q4_panels(const Quant4Tensor& w);

void q4_bf16_matmul(const float* x, int64_t m, const Q4Panels& w, float* y);
// n independent products y_i = x_i W_i^T (rows m_i) in one parallel pass over all their panels;
// each row computed exactly as q4_bf16_matmul computes it.
struct Q4Product {
  const float* x;
  int64_t m;
  const Q4Panels* w;
  float* y;
};
void q4_bf16_matmul_group(const Q4Product* products, int n);
// The same arithmetic in scalar code, single-threaded (tests compare the kernel with it).
void q4_bf16_matmul_reference(const float* x, int64_t m, const Q4Panels& w, float* y);

}  // namespace nf4flash
