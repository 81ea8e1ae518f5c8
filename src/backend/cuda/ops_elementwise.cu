// Launchers of the elementwise kernels (kernels/elementwise.cuh).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/kernels/elementwise.cuh"

namespace nf4flash::cuda {

namespace {
unsigned grid_for(int64_t n, int threads = 256) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 132 * 32)));
}
}  // namespace

void convert(const void* src, DType sd, void* dst, DType dd, int64_t n, cudaStream_t st) {
  NF4FLASH_DISPATCH_ACT(sd, "convert (source)", [&] {
    using TS = T;
    NF4FLASH_DISPATCH_ACT(dd, "convert (destination)", [&] {
      convert_kernel<TS, T><<<grid_for(n), 256, 0, st>>>(static_cast<const TS*>(src), static_cast<T*>(dst), n);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void embed(const void* table, DType tdt, int64_t vocab, int64_t hidden, const int32_t* ids, int64_t T_,
           void* out, DType act, cudaStream_t st, int64_t shard_row0) {
  if (T_ == 0) return;
  NF4FLASH_DISPATCH_ACT(act, "embed", [&] {
    using TA = T;
    NF4FLASH_DISPATCH_ACT(tdt, "embed (table)", [&] {
      dim3 grid(static_cast<unsigned>(std::min<int64_t>((hidden + 255) / 256, 64)), static_cast<unsigned>(T_));
      launch_k(embed_kernel<T, TA>, grid, dim3(256), 0, st, static_cast<const T*>(table), vocab, hidden, ids, static_cast<TA*>(out),
               shard_row0);
      CUDA_CHECK_LAUNCH();
    });
  });
}

namespace {
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The register-resident row kernel when the row fits (<= 1024 16-byte chunks) and is 16-byte
// aligned; returns false otherwise.
template <typename T, bool ADD>
bool rms_norm_vec(T* x, const T* d, const float* w, float eps, int64_t rows, int64_t cols, T* out, cudaStream_t st) {
  constexpr int E = 16 / sizeof(T);
  const int64_t nvec = cols / E;
  if (cols % E || nvec > 1024 || !aligned16(x) || !aligned16(out) || !aligned16(w) || (ADD && !aligned16(d)))
    return false;
  const unsigned grid = static_cast<unsigned>(rows);
  const int c = static_cast<int>(cols);
  if (nvec <= 256) launch_k(rms_norm_vec_kernel<T, 1, ADD>, dim3(grid), dim3(256), 0, st, x, d, w, eps, c, out);
  else if (nvec <= 512) launch_k(rms_norm_vec_kernel<T, 2, ADD>, dim3(grid), dim3(256), 0, st, x, d, w, eps, c, out);
  else launch_k(rms_norm_vec_kernel<T, 4, ADD>, dim3(grid), dim3(256), 0, st, x, d, w, eps, c, out);
  CUDA_CHECK_LAUNCH();
  return true;
}
}  // namespace

void rms_norm(const void* x, const float* w, float eps, int64_t rows, int64_t cols, void* out, DType act,
              cudaStream_t st) {
  if (rows == 0) return;
  NF4FLASH_DISPATCH_ACT(act, "rms_norm", [&] {
    if (cols <= 512) {
      launch_k(rms_norm_warp_kernel<T>, dim3(static_cast<unsigned>((rows + 7) / 8)), dim3(256), 0, st,
               static_cast<const T*>(x), w, eps, rows, cols, static_cast<T*>(out));
    } else if (!rms_norm_vec<T, false>(const_cast<T*>(static_cast<const T*>(x)), nullptr, w, eps, rows, cols,
                                        static_cast<T*>(out), st)) {
      launch_k(rms_norm_block_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(256), 0, st, static_cast<const T*>(x),
               w, eps, cols, static_cast<T*>(out));
    }
    CUDA_CHECK_LAUNCH();
  });
}

void add_rms_norm(void* x, const void* delta, const float* w, float eps, int64_t rows, int64_t cols, void* out,
                  DType act, cudaStream_t st) {
  if (rows == 0) return;
  NF4FLASH_DISPATCH_ACT(act, "add_rms_norm", [&] {
    if (!rms_norm_vec<T, true>(static_cast<T*>(x), static_cast<const T*>(delta), w, eps, rows, cols,
                               static_cast<T*>(out), st)) {
      add(x, delta, x, rows * cols, act, st);
      rms_norm(x, w, eps, rows, cols, out, act, st);
    }
  });
}

void rope(const RopeArgs& a, cudaStream_t st) {
  const int64_t n = a.T * (a.n_q_heads + a.n_k_heads) * (a.head_dim / 2);
  if (n == 0) return;
  NF4FLASH_DISPATCH_ACT(a.act, "rope", [&] {
    rope_kernel<T><<<grid_for(n), 256, 0, st>>>(a);
    CUDA_CHECK_LAUNCH();
  });
}

namespace {
template <typename Op>
void binary(const void* a, const void* b, void* out, int64_t n, DType act, cudaStream_t st, const char* what) {
  if (n == 0) return;
  NF4FLASH_DISPATCH_ACT(act, what, [&] {
    constexpr int E = 16 / sizeof(T);
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    if (n % E == 0 && aligned16(a) && aligned16(b) && aligned16(out))
      launch_k(binary_vec_kernel<T, Op>, dim3(grid_for(n / E)), dim3(256), 0, st, pa, pb, static_cast<T*>(out), n / E);
    else
      launch_k(binary_kernel<T, Op>, dim3(grid_for(n)), dim3(256), 0, st, pa, pb, static_cast<T*>(out), n);
    CUDA_CHECK_LAUNCH();
  });
}
}  // namespace

void silu_mul(const void* gate, const void* up, void* out, int64_t n, DType act, cudaStream_t st) {
  binary<SiluMulOp>(gate, up, out, n, act, st, "silu_mul");
}

void gelu_tanh_mul(const void* gate, const void* up, void* out, int64_t n, DType act, cudaStream_t st) {
  binary<GeluTanhMulOp>(gate, up, out, n, act, st, "gelu_tanh_mul");
}

void scale(void* x, float s, bool softcap, int64_t n, DType dt, cudaStream_t st) {
  if (n == 0) return;
  NF4FLASH_DISPATCH_ACT(dt, softcap ? "softcap" : "scale", [&] {
    if (softcap) scale_kernel<T, true><<<grid_for(n), 256, 0, st>>>(static_cast<T*>(x), s, n);
    else scale_kernel<T, false><<<grid_for(n), 256, 0, st>>>(static_cast<T*>(x), s, n);
    CUDA_CHECK_LAUNCH();
  });
}

void silu_mul_cols(const void* g, int64_t ldg, void* u, int64_t ldu, int64_t rows, int64_t cols, DType act,
                   cudaStream_t st) {
  if (rows == 0 || cols == 0) return;
  NF4FLASH_DISPATCH_ACT(act, "silu_mul_cols", [&] {
    constexpr int E = 16 / sizeof(T);
    NF4FLASH_CHECK(cols % E == 0 && ldg % E == 0 && ldu % E == 0 && aligned16(g) && aligned16(u),
                   "silu_mul_cols: columns and leading dimensions must be 16-byte multiples");
    silu_mul_cols_kernel<T><<<grid_for(rows * (cols / E)), 256, 0, st>>>(static_cast<const T*>(g), ldg,
                                                                         static_cast<T*>(u), ldu, rows, cols);
    CUDA_CHECK_LAUNCH();
  });
}

void add(const void* a, const void* b, void* out, int64_t n, DType act, cudaStream_t st) {
  binary<AddOp>(a, b, out, n, act, st, "add");
}

void bias_add(void* out, DType dt, const float* bias, int64_t rows, int64_t cols, cudaStream_t st) {
  if (rows * cols == 0) return;
  NF4FLASH_DISPATCH_ACT(dt, "bias_add", [&] {
    bias_add_kernel<T><<<grid_for(rows * cols), 256, 0, st>>>(static_cast<T*>(out), bias, rows, cols);
    CUDA_CHECK_LAUNCH();
  });
}

void kv_write(const KvWriteArgs& a, cudaStream_t st) {
  const int64_t n = a.T * a.n_kv * a.head_dim;
  if (n == 0) return;
  NF4FLASH_DISPATCH_ACT(a.act, "kv_write", [&] {
    using TA = T;
    NF4FLASH_DISPATCH_ACT(a.kv_dtype, "kv_write (cache)", [&] {
      kv_write_kernel<TA, T><<<grid_for(n), 256, 0, st>>>(a);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void rope_kv_write(const RopeArgs& r, const KvWriteArgs& kv, cudaStream_t st) {
  NF4FLASH_CHECK(r.T == kv.T && r.n_k_heads == kv.n_kv && r.head_dim == kv.head_dim && r.k == kv.k && r.act == kv.act,
                 "rope_kv_write: rope and cache arguments disagree");
  const int64_t n = r.T * (r.n_q_heads + r.n_k_heads) * (r.head_dim / 2) + kv.T * kv.n_kv * kv.head_dim;
  if (n == 0) return;
  NF4FLASH_CHECK(!r.q_norm || (r.k_norm && rope_norm_fusable(r.head_dim)), "rope_kv_write: q/k norms at head_dim ",
                 r.head_dim, " (fused at 64, 128 and 256)");
  NF4FLASH_DISPATCH_ACT(r.act, "rope_kv_write", [&] {
    using TA = T;
    NF4FLASH_DISPATCH_ACT(kv.kv_dtype, "rope_kv_write (cache)", [&] {
      const unsigned ty = static_cast<unsigned>(std::min<int64_t>(r.T, 65535));
      if (r.q_norm) {  // 8 heads (warps) a block, or 256 v elements, whichever needs more blocks
        const int heads = r.n_q_heads + r.n_k_heads, n_v = kv.n_kv * kv.head_dim;
        const dim3 grid(unsigned(std::max((heads + 7) / 8, (n_v + 255) / 256)), ty);
        switch (r.head_dim) {
          case 64: launch_k(rope_norm_kv_kernel<TA, T, 2>, grid, dim3(256), 0, st, r, kv); break;
          case 128: launch_k(rope_norm_kv_kernel<TA, T, 4>, grid, dim3(256), 0, st, r, kv); break;
          default: launch_k(rope_norm_kv_kernel<TA, T, 8>, grid, dim3(256), 0, st, r, kv); break;
        }
      } else {
        const int per_t = (r.n_q_heads + r.n_k_heads) * (r.head_dim / 2) + kv.n_kv * kv.head_dim;
        launch_k(rope_kv_kernel<TA, T>, dim3(grid_for(per_t), ty), dim3(256), 0, st, r, kv);
      }
      CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace nf4flash::cuda
