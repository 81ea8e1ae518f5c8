// CudaBackend's weight uploads: dense tensors (converted to the storage dtype on the host, vectors
// with an f32 copy for the kernels), untied embedding tables in pinned host memory (a step gathers
// its rows), and 4-bit weights repacked on the GPU into the tile16x64 layout (kernels/gemv_q4.cuh)
// with their absmax per (row tile, column tile, row); shapes the layout cannot hold are
// dequantized at load (exact bitsandbytes arithmetic) and kept dense.
#include "backend/cuda/cuda_backend_impl.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"

namespace nf4flash::cuda_impl {

std::unique_ptr<Weight> CudaBackend::upload_dense(const TensorInfo& t, DType store) {
  NF4FLASH_CHECK(store == DType::F32 || store == DType::BF16 || store == DType::F16, t.name,
                 ": cannot store as ", dtype_name(store), " on CUDA");
  const int64_t n = t.numel();
  const int64_t rows = t.shape.size() >= 2 ? t.shape[0] : 1;
  const int64_t cols = rows ? n / rows : 0;
  auto w = std::make_unique<CudaDense>(store, rows, cols);
  std::vector<uint8_t> host;
  const void* src = t.data;
  if (t.dtype != store) {
    host.resize(size_t(n) * dtype_size(store));
    for (int64_t i = 0; i < n; ++i) host_store(host.data(), store, i, host_load(t.data, t.dtype, i));
    src = host.data();
  }
  w->data = std::make_unique<CudaBuffer>(size_t(n) * dtype_size(store));
  upload(w->data->data(), src, w->data->bytes());
  if (rows == 1) {
    std::vector<float> f(n);
    for (int64_t i = 0; i < n; ++i) f[i] = host_load(t.data, t.dtype, i);
    w->f32 = std::make_unique<CudaBuffer>(size_t(n) * 4);
    upload(w->f32->data(), f.data(), w->f32->bytes());
  }
  if (store != act_) reserve_scratch(n);
  w->set_size();
  return w;
}

std::unique_ptr<Weight> CudaBackend::upload_embedding(const TensorInfo& t, DType store, bool tied) {
  if (tied || t.shape.size() != 2) return upload_dense(t, store);
  NF4FLASH_CHECK(store == DType::F32 || store == DType::BF16 || store == DType::F16, t.name,
                 ": cannot store as ", dtype_name(store), " on CUDA");
  auto w = std::make_unique<CudaDense>(store, t.shape[0], t.shape[1]);
  const int64_t n = t.numel();
  auto hb = std::make_unique<CudaHostBuffer>(size_t(n) * dtype_size(store));
  uint8_t* dst = static_cast<uint8_t*>(hb->data());
  if (t.dtype == store) {
    const size_t piece = size_t{4} << 20, total = hb->bytes();
    thread_pool().parallel_for(static_cast<int64_t>((total + piece - 1) / piece), 1, [&](int64_t p0, int64_t p1) {
      const size_t b = size_t(p0) * piece, e = std::min(total, size_t(p1) * piece);
      std::memcpy(dst + b, t.data + b, e - b);
    });
  }
  else for (int64_t i = 0; i < n; ++i) host_store(dst, store, i, host_load(t.data, t.dtype, i));
  w->data = std::move(hb);
  w->on_host = true;
  w->set_size();
  return w;
}

std::unique_ptr<Weight> CudaBackend::upload_quant4(std::shared_ptr<const Quant4Tensor> qp) {
  const Quant4Tensor& q = *qp;
  NF4FLASH_CHECK(q.rows > 0 && q.cols > 0 && q.packed.size() == size_t((q.numel() + 1) / 2),
                 "4-bit weight [", q.rows, ", ", q.cols, "]: packed size ", q.packed.size(), " does not match");
  auto w = std::make_unique<CudaQ4>(q);
  std::string why;
  if (q.cols % 64) why = cat("in_features ", q.cols, " not a multiple of 64");
  else if (!is_pow2(q.blocksize) || q.blocksize < 64) why = cat("blocksize ", q.blocksize, " (need a power of two >= 64)");
  else if (q.double_quant && !is_pow2(q.nested_blocksize)) why = cat("nested blocksize ", q.nested_blocksize);
  if (!why.empty()) {
    // Dequantize on the host (exact bitsandbytes arithmetic) and keep it dense.
    std::vector<float> f(size_t(q.numel()));
    for (int64_t i = 0; i < q.numel(); ++i) {
      const uint8_t b = q.packed[size_t(i / 2)];
      f[size_t(i)] = q.code[(i & 1) ? (b & 15) : (b >> 4)] * q.block_absmax(i / q.blocksize);
    }
    TensorInfo ti;
    ti.name = "4-bit weight";
    ti.dtype = DType::F32;
    ti.shape = {q.rows, q.cols};
    ti.data = reinterpret_cast<const uint8_t*>(f.data());
    ti.nbytes = f.size() * 4;
    w->fallback.reset(static_cast<CudaDense*>(upload_dense(ti, act_).release()));
    w->fallback_why = why;
    w->set_bytes(w->fallback->resident_bytes());
    return w;
  }
  Q4Device& d = w->dev;
  d.rows = q.rows;
  d.cols = q.cols;
  d.RT = (q.rows + 15) / 16;
  d.KT = q.cols / 64;
  d.log2_blocksize = ilog2(q.blocksize);
  d.log2_nested = ilog2(q.nested_blocksize);
  d.double_quant = q.double_quant;
  d.offset = q.offset;
  for (int i = 0; i < 16; ++i) d.code[i] = q.code[size_t(i)];
  // codes: upload flat, repack on the GPU
  {
    CudaBuffer flat(q.packed.size());
    upload(flat.data(), q.packed.data(), q.packed.size());
    w->tiles = std::make_unique<CudaBuffer>(size_t(d.RT * d.KT * 512));
    q4_repack(static_cast<const uint8_t*>(flat.data()), q.rows, q.cols, static_cast<uint8_t*>(w->tiles->data()), stream_);
    sync();
  }
  d.tiles = static_cast<const uint8_t*>(w->tiles->data());
  // absmax per (row tile, col tile, row), gathered from the block layout by the host threads
  const int64_t n_t = d.RT * d.KT * 16;
  auto tile = [&](auto& at, const auto& src) {
    at.assign(size_t(n_t), 0);
    thread_pool().parallel_for(d.RT, 16, [&](int64_t rt0, int64_t rt1) {
      for (int64_t rt = rt0; rt < rt1; ++rt)
        for (int r = 0; r < 16 && rt * 16 + r < q.rows; ++r) {
          const int64_t row = rt * 16 + r;
          for (int64_t kt = 0; kt < d.KT; ++kt)
            at[size_t((rt * d.KT + kt) * 16 + r)] = src[size_t((row * q.cols + kt * 64) >> d.log2_blocksize)];
        }
    });
  };
  if (!q.double_quant) {
    std::vector<float> at;
    tile(at, q.absmax);
    w->absmax = std::make_unique<CudaBuffer>(at.size() * 4);
    upload(w->absmax->data(), at.data(), w->absmax->bytes());
    d.absmax_tiled = static_cast<const float*>(w->absmax->data());
  } else {
    std::vector<uint8_t> at;
    tile(at, q.absmax_q);
    w->absmax = std::make_unique<CudaBuffer>(at.size());
    upload(w->absmax->data(), at.data(), at.size());
    d.absq_tiled = static_cast<const uint8_t*>(w->absmax->data());
    w->nested_absmax = std::make_unique<CudaBuffer>(q.nested_absmax.size() * 4);
    upload(w->nested_absmax->data(), q.nested_absmax.data(), w->nested_absmax->bytes());
    d.nested_absmax = static_cast<const float*>(w->nested_absmax->data());
    w->nested_code = std::make_unique<CudaBuffer>(256 * 4);
    upload(w->nested_code->data(), q.nested_code.data(), 256 * 4);
    d.nested_code = static_cast<const float*>(w->nested_code->data());
    w->nested_code_host.assign(q.nested_code.begin(), q.nested_code.end());
  }
  // the fused GEMM needs no scratch; rows past q4_fused_max_rows_ take dequantize + cuBLAS, whose
  // scratch is allocated at the first such product (gemm_q4)
  if (q4_fused_max_rows_ != INT64_MAX) q4_scratch_numel_ = std::max(q4_scratch_numel_, d.rows * d.cols);
  w->set_bytes(w->tiles->bytes() + w->absmax->bytes() + (w->nested_absmax ? w->nested_absmax->bytes() : 0) +
                (w->nested_code ? w->nested_code->bytes() : 0));
  return w;
}

}  // namespace nf4flash::cuda_impl
