// Helpers of the CUDA op tests: a CPU f32 reference backend and a CUDA backend fed the same
// random inputs (fresh seed each run, printed on failure), relative-L2 comparison.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "quant/blockwise.h"
#include "test_util.h"

namespace nf4flash::test {

#define NF4FLASH_REQUIRE_CUDA()                                                                     \
  do {                                                                                              \
    if (::nf4flash::cuda_device_count() == 0)                                                       \
      GTEST_SKIP() << "no CUDA device: the CUDA op tests need a GPU (they run in scripts/gpu-check.sh)"; \
  } while (0)

inline std::mt19937& rng() {
  static std::mt19937 g = [] {
    const unsigned seed = std::random_device{}();
    std::printf("[cuda op tests] seed %u\n", seed);
    return std::mt19937(seed);
  }();
  return g;
}

inline std::vector<float> randn(size_t n, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = d(rng());
    if (x == 0.f) x = 1e-3f;
  }
  return v;
}

// Round every value to `dt` (so both backends see identical inputs).
inline std::vector<float> rounded(std::vector<float> v, DType dt) {
  for (auto& x : v) x = dt == DType::BF16 ? round_bf16(x) : dt == DType::F16 ? round_f16(x) : x;
  return v;
}

inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(got[i]) - ref[i];
    if (std::isnan(got[i])) return INFINITY;
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

inline double tol_for(DType dt) { return dt == DType::F32 ? 2e-5 : dt == DType::F16 ? 3e-3 : 1e-2; }

// Device memory of one backend holding a [rows, cols] activation in the backend's dtype.
struct DevAct {
  std::unique_ptr<Buffer> buf;
  Act act;
  Backend* be = nullptr;
  DevAct(Backend& b, int64_t rows, int64_t cols, DType dt) : be(&b) {
    buf = b.alloc(size_t(rows * cols) * dtype_size(dt) + 16);
    act = Act{buf->data(), dt, rows, cols};
  }
  DevAct(Backend& b, int64_t rows, int64_t cols) : DevAct(b, rows, cols, b.act_dtype()) {}
  void set(const std::vector<float>& v) {
    std::vector<uint8_t> h(act.bytes());
    for (size_t i = 0; i < v.size(); ++i) {
      if (act.dtype == DType::F32) std::memcpy(h.data() + 4 * i, &v[i], 4);
      else {
        const uint16_t x = act.dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
        std::memcpy(h.data() + 2 * i, &x, 2);
      }
    }
    be->upload(act.data, h.data(), h.size());
  }
  void poison() {
    std::vector<uint8_t> h(act.bytes(), 0xff);  // NaN in every float type
    be->upload(act.data, h.data(), h.size());
  }
  std::vector<float> get() const {
    std::vector<uint8_t> h(act.bytes());
    be->download(h.data(), act.data, h.size());
    std::vector<float> v(size_t(act.numel()));
    for (size_t i = 0; i < v.size(); ++i) {
      if (act.dtype == DType::F32) std::memcpy(&v[i], h.data() + 4 * i, 4);
      else {
        uint16_t x;
        std::memcpy(&x, h.data() + 2 * i, 2);
        v[i] = act.dtype == DType::BF16 ? bf16_to_f32(x) : f16_to_f32(x);
      }
    }
    return v;
  }
};

// Device int32 values (ids, positions).
struct DevInts {
  std::unique_ptr<Buffer> buf;
  DevInts(Backend& b, const std::vector<int32_t>& v) {
    buf = b.alloc(std::max<size_t>(v.size(), 1) * 4);
    if (!v.empty()) b.upload(buf->data(), v.data(), v.size() * 4);
  }
  int32_t* ptr() const { return static_cast<int32_t*>(buf->data()); }
};

inline TensorInfo f32_tensor(const std::vector<float>& v, std::vector<int64_t> shape) {
  TensorInfo t;
  t.name = "test";
  t.dtype = DType::F32;
  t.shape = std::move(shape);
  t.data = reinterpret_cast<const uint8_t*>(v.data());
  t.nbytes = v.size() * 4;
  return t;
}

// A mixture-of-experts block's config: hidden size H, E experts of I rows, top K, the K weights
// renormalized when norm_topk.
inline ModelConfig moe_test_config(int64_t H, int E, int K, int64_t I, bool norm_topk) {
  ModelConfig cfg;
  cfg.hidden_size = H;
  cfg.moe.n_experts = E;
  cfg.moe.top_k = K;
  cfg.moe.expert_intermediate = I;
  cfg.moe.norm_topk = norm_topk;
  return cfg;
}

// The CPU f32 reference and a CUDA backend with the default tuning, or with `t` (tuning_with).
struct Backends {
  std::unique_ptr<Backend> cpu, gpu;
  explicit Backends(DType compute = DType::BF16, const CudaTuning& t = {}) {
    cpu = make_cpu_backend({DType::F32, 0});
    CudaBackendOptions o;
    o.compute = compute;
    o.tuning = t;
    gpu = make_cuda_backend(o);
  }
};

// A 4-bit weight (random, std 0.05) uploaded to both backends, with an optional f32 bias (the GPU
// copy in the compute dtype dt).
struct QW {
  std::unique_ptr<Weight> cpu, gpu, bcpu, bgpu;
  int64_t N = 0, K = 0;
};
// A random [N, K] weight (std 0.05) quantized to 4 bits, blocks of 64.
inline std::shared_ptr<Quant4Tensor> random_quant4(int64_t N, int64_t K, QuantType type, bool dq) {
  auto W = randn(size_t(N * K), 0.05f);
  return std::make_shared<Quant4Tensor>(quantize_4bit(W.data(), DType::F32, N, K, type, 64, dq));
}

inline QW make_q4(Backends& b, DType dt, QuantType type, bool dq, int64_t N, int64_t K, bool bias) {
  QW w;
  w.N = N;
  w.K = K;
  auto q = random_quant4(N, K, type, dq);
  w.cpu = b.cpu->upload_quant4(q);
  w.gpu = b.gpu->upload_quant4(q);
  if (bias) {
    auto B = randn(size_t(N), 0.1f);
    w.bcpu = b.cpu->upload_dense(f32_tensor(B, {N}), DType::F32);
    w.bgpu = b.gpu->upload_dense(f32_tensor(B, {N}), dt);
  }
  return w;
}

// One poisoned [T, N] output per weight on backend be (ys) and the LinearOut list over them, with
// the CPU or the GPU copies of the weights (W: cpu, gpu, bcpu, bgpu, N).
template <typename W>
std::vector<Backend::LinearOut> linear_outs(Backend& be, const std::vector<W>& ws, int64_t T, bool cpu,
                                            std::vector<std::unique_ptr<DevAct>>& ys) {
  std::vector<Backend::LinearOut> o;
  for (auto& w : ws) {
    ys.push_back(std::make_unique<DevAct>(be, T, w.N));
    ys.back()->poison();
    o.push_back({cpu ? w.cpu.get() : w.gpu.get(), cpu ? w.bcpu.get() : w.bgpu.get(), ys.back()->act});
  }
  return o;
}

// The norm folded into the decode GEMVs, from x (xc / xg, set) with the norm weights nc / ng:
// rms_norm_linear_multi over ws and rms_norm_linear_swiglu over g, u on the GPU give bit for bit
// what rms_norm + linear_multi / linear_swiglu give there, and are within 5e-3 / 1e-2 of the CPU's.
// xnc / xng: the normalized x (scratch); I: the rows of g and u (W: cpu, gpu, bcpu, bgpu, N).
template <typename W>
void expect_norm_folds(Backends& b, DevAct& xc, DevAct& xg, DevAct& xnc, DevAct& xng, const Weight& nc,
                       const Weight& ng, float eps, const std::vector<W>& ws, const W& g, const W& u, int64_t T,
                       int64_t I) {
  std::vector<std::unique_ptr<DevAct>> yf, yu, yc;
  auto of = linear_outs(*b.gpu, ws, T, false, yf), ou = linear_outs(*b.gpu, ws, T, false, yu),
       oc = linear_outs(*b.cpu, ws, T, true, yc);
  b.gpu->rms_norm_linear_multi(xg.act, ng, eps, xng.act, of.data(), int(of.size()));
  b.gpu->rms_norm(xg.act, ng, eps, xng.act);
  b.gpu->linear_multi(xng.act, ou.data(), int(ou.size()));
  b.cpu->rms_norm_linear_multi(xc.act, nc, eps, xnc.act, oc.data(), int(oc.size()));
  for (size_t i = 0; i < ws.size(); ++i) {
    EXPECT_EQ(yf[i]->get(), yu[i]->get()) << "rms_norm_linear_multi segment " << i;
    EXPECT_LT(rel_err(yf[i]->get(), yc[i]->get()), 5e-3) << "rms_norm_linear_multi segment " << i;
  }
  DevAct gtc(*b.cpu, T, I), gtg(*b.gpu, T, I), o2c(*b.cpu, T, I), o2f(*b.gpu, T, I), o2u(*b.gpu, T, I);
  o2f.poison();
  b.gpu->rms_norm_linear_swiglu(xg.act, ng, eps, xng.act, *g.gpu, nullptr, *u.gpu, u.bgpu.get(), gtg.act, o2f.act);
  b.gpu->rms_norm(xg.act, ng, eps, xng.act);
  b.gpu->linear_swiglu(xng.act, *g.gpu, nullptr, *u.gpu, u.bgpu.get(), gtg.act, o2u.act);
  b.cpu->rms_norm_linear_swiglu(xc.act, nc, eps, xnc.act, *g.cpu, nullptr, *u.cpu, u.bcpu.get(), gtc.act, o2c.act);
  EXPECT_EQ(o2f.get(), o2u.get()) << "rms_norm_linear_swiglu";
  EXPECT_LT(rel_err(o2f.get(), o2c.get()), 1e-2) << "rms_norm_linear_swiglu";
}

}  // namespace nf4flash::test
