// Launchers of the 4-bit kernels that read the tile16x64 layout: the repack at upload, the decode
// GEMV (kernels/gemv_q4_decode.cuh), the register GEMV (kernels/gemv_q4.cuh) and the dequantize
// kernel of the GEMM path.
#include <algorithm>

#include "backend/cuda/kernels/gemv_q4.cuh"
#include "backend/cuda/kernels/gemv_q4_decode.cuh"

namespace nf4flash::cuda {

// One thread per output word of the tiled layout (kernels/gemv_q4.cuh, header comment).
__global__ void q4_repack_kernel(const uint8_t* __restrict__ packed, int64_t rows, int64_t cols,
                                 int64_t KT, int64_t n_words, uint32_t* __restrict__ tiles) {
  const int64_t wi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (wi >= n_words) return;
  const int64_t tile = wi >> 7;
  const int lane = int(wi >> 2) & 31, j = int(wi & 3);
  const int64_t rt = tile / KT, kt = tile % KT;
  const int g = lane >> 2, t = lane & 3;
  const int64_t r0 = rt * 16 + g, r1 = r0 + 8, c0 = kt * 32 + 8 * t + 2 * j, rb = cols / 2;
  auto src = [&](int64_t r, int64_t c) -> uint32_t { return r < rows ? packed[r * rb + c] : 0u; };
  tiles[wi] = src(r0, c0) | (src(r1, c0) << 8) | (src(r0, c0 + 1) << 16) | (src(r1, c0 + 1) << 24);
}

void q4_repack(const uint8_t* packed_dev, int64_t rows, int64_t cols, uint8_t* tiles_dev, cudaStream_t st) {
  const int64_t RT = (rows + 15) / 16, KT = cols / 64, n_words = RT * KT * 128;
  const int threads = 256;
  q4_repack_kernel<<<static_cast<unsigned>((n_words + threads - 1) / threads), threads, 0, st>>>(
      packed_dev, rows, cols, KT, n_words, reinterpret_cast<uint32_t*>(tiles_dev));
  CUDA_CHECK_LAUNCH();
}

// ---- register GEMV (9..32 rows, in launches of 8) ----------------------------------------------
namespace {
template <typename TA, bool DQ>
void launch_q4(const GemvQ4Args& g, cudaStream_t st) {
  auto kernel = gemv_q4_kernel<TA, DQ>;
  constexpr int threads = kQ4RegWarps * 32;
  static const int per_sm = [&] {  // shared-memory opt-in and blocks per SM, once per instantiation
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kQ4LutBytes));
    int v = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, kernel, threads, kQ4LutBytes));
    return std::max(v, 1);
  }();
  const Q4KernelArgs a{*g.w, g.x, g.T, g.bias, g.out, g.out_dtype == DType::F32};
  const int grid = int(std::min<int64_t>(g.w->RT, int64_t(per_sm) * device_sm_count()));
  launch_k(kernel, dim3(unsigned(grid)), dim3(threads), size_t(kQ4LutBytes), st, a);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void gemv_q4(const GemvQ4Args& g, cudaStream_t st) {
  NF4FLASH_CHECK(g.T >= 1 && g.T <= kGemvMaxRows, "gemv_q4: T=", g.T, " outside 1..", kGemvMaxRows);
  if (g.act == DType::BF16) {
    if (g.w->double_quant) launch_q4<__nv_bfloat16, true>(g, st);
    else launch_q4<__nv_bfloat16, false>(g, st);
  } else if (g.act == DType::F16) {
    if (g.w->double_quant) launch_q4<__half, true>(g, st);
    else launch_q4<__half, false>(g, st);
  } else {
    fail("gemv_q4: compute dtype ", dtype_name(g.act), " not supported by the fused 4-bit GEMV (bf16/f16)");
  }
}

// ---- decode GEMV (1..8 rows) --------------------------------------------------------------------
Q4DecodeArgs gemv_q4_decode_kernel_args(const GemvQ4DecodeArgs& g) {
  NF4FLASH_CHECK(g.T >= 1 && g.T <= kGemvMaxRows, "gemv_q4_decode: T=", g.T, " outside 1..", kGemvMaxRows);
  NF4FLASH_CHECK(g.nseg >= 1 && g.nseg <= kGemvMaxSegs, "gemv_q4_decode: ", g.nseg, " segments");
  Q4DecodeArgs k{};
  const Q4Device& w0 = *g.w[0];
  for (int i = 0; i < 16; ++i) k.code[i] = w0.code[i];
  k.nested_code = w0.nested_code;
  k.cols = w0.cols;
  k.KT = w0.KT;
  k.log2_blocksize = w0.log2_blocksize;
  k.log2_nested = w0.log2_nested;
  k.nseg = g.nseg;
  k.T = g.T;
  k.ep = int(g.ep);
  k.x = g.x;
  k.out_f32 = g.out_dtype == DType::F32;
  NF4FLASH_CHECK(!k.out_f32 || g.ep == GemvEpilogue::Store, "gemv_q4_decode: f32 output only with a plain store");
  NF4FLASH_CHECK(g.ep != GemvEpilogue::SwiGLU || g.nseg == 2, "gemv_q4_decode: SwiGLU takes gate and up");
  NF4FLASH_CHECK(g.ep != GemvEpilogue::Residual || g.nseg == 1, "gemv_q4_decode: residual takes one weight");
  int64_t units = 0;
  for (int s = 0; s < g.nseg; ++s) {
    const Q4Device& w = *g.w[s];
    NF4FLASH_CHECK(q4_same_params(w, w0), "gemv_q4_decode: segment ", s,
                   " differs in shape or quantization from segment 0");
    q4_fill_seg(k.seg[s], w, g.bias[s], g.out[s]);
    units += w.RT;
    k.unit_end[s] = units;
  }
  if (g.ep == GemvEpilogue::SwiGLU) {
    NF4FLASH_CHECK(g.w[1]->rows == w0.rows, "gemv_q4_decode: gate and up differ in rows");
    k.nsub = 2;
    units = w0.RT;
  } else {
    k.nsub = 1;
  }
  k.units = units;
  if (g.norm_w) {
    NF4FLASH_CHECK(gemv_q4_norm_fusable(g.T, k.cols), "gemv_q4_decode: rms_norm cannot be folded here (T=", g.T,
                   ", cols=", k.cols, ")");
    k.norm_w = g.norm_w;
    k.norm_eps = g.norm_eps;
  }
  return k;
}

namespace {
// Whether the shared-memory kernel serves these arguments: x fits beside the table, 32-bit offsets.
bool decode_smem_applies(const Q4DecodeArgs& k) {
  if (int64_t(k.T) * decode_x_stride(k.cols) > kDecodeXMax) return false;
  if (k.units > (int64_t(1) << 30) || k.KT > (int64_t(1) << 24)) return false;
  for (int s = 0; s < k.nseg; ++s)  // 32-bit row * cols (nested absmax index)
    if (uint64_t(k.seg[s].rows) * uint64_t(k.cols) >= (uint64_t(1) << 32)) return false;
  return true;
}

// Blocks of a kernel one multiprocessor holds with `smem` bytes of dynamic shared memory (its limit
// set on first use to `smem_max`).
template <auto Kernel>
int resident_per_sm(int smem_max) {
  static const int per_sm = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_max));
    int v = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, Kernel, kDecodeW * 32, smem_max));
    return std::max(v, 1);
  }();
  return per_sm;
}

template <auto Kernel>
void launch_decode_smem(Q4DecodeArgs& k, cudaStream_t st) {
  const int per_sm = resident_per_sm<Kernel>(kQ4LutBytes + kDecodeXMax);
  k.x_stride = decode_x_stride(k.cols);
  const int smem = kQ4LutBytes + k.T * k.x_stride;
  const int64_t grid = std::min<int64_t>(k.units, int64_t(per_sm) * device_sm_count());
  launch_k(Kernel, dim3(unsigned(grid)), dim3(kDecodeW * 32), size_t(smem), st, k);
  CUDA_CHECK_LAUNCH();
}

template <typename TA, bool DQ>
void launch_decode(Q4DecodeArgs& k, cudaStream_t st) {
  if (decode_smem_applies(k)) {
    const bool full = k.KT % (kDecodeW * kDecodeU) == 0;
    if (k.T == 1) {
      if (full) launch_decode_smem<gemv_q4_decode_kernel<TA, DQ, true, true>>(k, st);
      else launch_decode_smem<gemv_q4_decode_kernel<TA, DQ, false, true>>(k, st);
    } else {
      if (full) launch_decode_smem<gemv_q4_decode_kernel<TA, DQ, true, false>>(k, st);
      else launch_decode_smem<gemv_q4_decode_kernel<TA, DQ, false, false>>(k, st);
    }
    return;
  }
  NF4FLASH_CHECK(!k.norm_w, "gemv_q4_decode: a folded rms_norm needs x in shared memory (gemv_q4_norm_fusable)");
  constexpr auto kernel = gemv_q4_decode_gx_kernel<TA, DQ>;
  const int per_sm = resident_per_sm<kernel>(kQ4LutBytes);
  const int64_t grid = std::min<int64_t>(k.units, int64_t(per_sm) * device_sm_count());
  launch_k(kernel, dim3(unsigned(grid)), dim3(kDecodeW * 32), size_t(kQ4LutBytes), st, k);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

bool gemv_q4_norm_fusable(int64_t T, int64_t cols) {
  // 256-thread blocks: the prologue repeats rms_norm_vec_kernel's summation order
  static_assert(kDecodeW == 8, "the folded rms_norm needs 256-thread blocks");
  return T >= 1 && T <= kGemvMaxRows && cols % 64 == 0 && cols / 8 <= 1024 && T * decode_x_stride(cols) <= kDecodeXMax;
}

void gemv_q4_decode(const GemvQ4DecodeArgs& g, cudaStream_t st) {
  Q4DecodeArgs k = gemv_q4_decode_kernel_args(g);
  const bool dq = g.w[0]->double_quant;
  if (g.act == DType::BF16) {
    if (dq) launch_decode<__nv_bfloat16, true>(k, st);
    else launch_decode<__nv_bfloat16, false>(k, st);
  } else if (g.act == DType::F16) {
    if (dq) launch_decode<__half, true>(k, st);
    else launch_decode<__half, false>(k, st);
  } else {
    fail("gemv_q4_decode: compute dtype ", dtype_name(g.act), " not supported (bf16/f16)");
  }
}

// ---- dequantize (the GEMM path) -----------------------------------------------------------------
void q4_dequant(const Q4Device& w, void* out, DType dtype, cudaStream_t st, int64_t row0, int64_t nrows) {
  if (nrows < 0) nrows = w.rows - row0;
  NF4FLASH_CHECK(row0 >= 0 && row0 + nrows <= w.rows, "q4_dequant: rows [", row0, ", ", row0 + nrows,
                 ") out of range (", w.rows, ")");
  const int64_t n = nrows * (w.cols / 8);
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  NF4FLASH_DISPATCH_ACT(dtype, "q4_dequant", [&] {
    if (w.double_quant) q4_dequant8_kernel<T, true><<<blocks, threads, 0, st>>>(w, row0, nrows, static_cast<T*>(out));
    else q4_dequant8_kernel<T, false><<<blocks, threads, 0, st>>>(w, row0, nrows, static_cast<T*>(out));
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace nf4flash::cuda
