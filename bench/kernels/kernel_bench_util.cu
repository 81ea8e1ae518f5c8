// Helpers of kernel-bench (kernel_bench.cu): the read-only streaming reference kernel, graph-replay
// timing, host tensors of random 4-bit and bf16 weights, and the prefill attention rows.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <functional>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernel_bench_util.h"
#include "backend/cuda/launchers.h"

namespace nf4flash::kbench {

using cuda::to_f32;

// Read-only streaming reference: every thread reads 16-byte words, 4 in flight, grid-stride; the
// xor of all words is stored only if it equals a value it cannot take, so nothing is optimized out.
// Shapes: src [n16] uint4; grid 4 blocks per SM x 256 threads.
__global__ void __launch_bounds__(256) read_only_kernel(const uint4* __restrict__ src, int64_t n16, uint4* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = cuda::ld_stream_u4(src + i + k * stride);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = cuda::ld_stream_u4(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u && threadIdx.x == 1023) sink->x = acc;  // threadIdx.x < 256: never true
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds per call of `body` (called reps times per trial), timed via graph replays.
double time_graph(Backend& be, const std::function<void(int)>& body, int reps, int trials) {
  be.sync();
  be.capture_begin();
  for (int i = 0; i < reps; ++i) body(i);
  const int id = be.capture_end();
  be.replay(id);
  be.sync();
  std::vector<double> t;
  for (int k = 0; k < trials; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    be.replay(id);
    be.sync();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  return median(t);
}

double time_stream_graph(const std::function<void(int, cudaStream_t)>& launch, int reps, int trials) {
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < reps; ++i) launch(i, st);
  CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CUDA_CHECK(cudaGraphLaunch(exec, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  std::vector<double> t;
  for (int k = 0; k < trials; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    CUDA_CHECK(cudaGraphLaunch(exec, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaStreamDestroy(st));
  return median(t);
}

std::vector<int> env_int_list(const char* name) {
  std::vector<int> r;
  const char* v = std::getenv(name);
  for (const char* p = v ? v : ""; *p;) {
    r.push_back(std::atoi(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return r;
}

std::unique_ptr<Weight> upload_bf16_pattern(Backend& be, const char* name, int64_t N, int64_t K, uint32_t first) {
  std::vector<uint16_t> h(size_t(N * K));
  for (size_t i = 0; i < h.size(); ++i)
    h[i] = f32_to_bf16(float(int((uint64_t(first) + i) * 2654435761u % 2001) - 1000) * 1e-5f);
  return be.upload_dense(bf16_tensor(name, N, K, h), DType::BF16);
}

// A [rows, cols] bf16 tensor view of host bits (for upload_dense).
TensorInfo bf16_tensor(const char* name, int64_t rows, int64_t cols, const std::vector<uint16_t>& bits) {
  TensorInfo ti;
  ti.name = name;
  ti.dtype = DType::BF16;
  ti.shape = {rows, cols};
  ti.data = reinterpret_cast<const uint8_t*>(bits.data());
  ti.nbytes = bits.size() * 2;
  return ti;
}

std::unique_ptr<Buffer> upload_rope_freqs(Backend& be, int hd, float theta) {
  std::vector<float> f(size_t(hd / 2));
  for (int i = 0; i < hd / 2; ++i) f[size_t(i)] = std::pow(theta, -2.f * i / hd);
  auto b = be.alloc(f.size() * 4);
  be.upload(b->data(), f.data(), f.size() * 4);
  return b;
}

std::unique_ptr<Buffer> upload_randn_bf16(Backend& be, size_t n, std::mt19937& g) {
  std::normal_distribution<float> nd;
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = f32_to_bf16(nd(g));
  auto b = be.alloc(n * 2);
  be.upload(b->data(), h.data(), n * 2);
  return b;
}

std::shared_ptr<Quant4Tensor> random_q4(int64_t rows, int64_t cols, bool dq, std::mt19937& g) {
  auto q = std::make_shared<Quant4Tensor>();
  q->type = QuantType::NF4;
  q->rows = rows;
  q->cols = cols;
  q->blocksize = 64;
  const float nf4[16] = {-1.0f, -0.6961928f, -0.5250731f, -0.3949175f, -0.2844414f, -0.1848089f, -0.0910500f, 0.0f,
                         0.0795803f, 0.1609302f, 0.2461123f, 0.3379152f, 0.4407098f, 0.5626170f, 0.7229568f, 1.0f};
  for (int i = 0; i < 16; ++i) q->code[size_t(i)] = nf4[i];
  q->packed.resize(size_t(rows * cols / 2));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : q->packed) b = uint8_t(byte(g));
  const int64_t nb = q->num_blocks();
  std::uniform_real_distribution<float> u(0.01f, 0.1f);
  if (!dq) {
    q->absmax.resize(size_t(nb));
    for (auto& a : q->absmax) a = u(g);
  } else {
    q->double_quant = true;
    q->absmax_q.resize(size_t(nb));
    for (auto& a : q->absmax_q) a = uint8_t(byte(g));
    q->nested_absmax.resize(size_t((nb + 255) / 256));
    for (auto& a : q->nested_absmax) a = u(g);
    for (int i = 0; i < 256; ++i) q->nested_code[size_t(i)] = -1.f + 2.f * i / 255.f;
    q->offset = 0.05f;
  }
  return q;
}

// Prefill attention kernels alone (--attn flash | sdpa | eager), Llama-3-8B layer shape (32 q
// heads, 8 kv heads, head_dim 128), bf16, batch 1, causal, pos0 = 0, T = seq. Timed per call
// (1 warm-up, then `trials` calls each followed by a synchronize; median), not in a graph: eager
// sizes its score chunks from the host-known length. FLOP convention (causal, as FlashAttention's
// benchmarks): 4 * seq^2 / 2 * head_dim * n_heads (two GEMMs of 2*seq*seq*hd, half masked).
nlohmann::json bench_attention_prefill(Backend& be, int trials, std::mt19937& g) {
  using nlohmann::json;
  json rows = json::array();
  const int nh = 32, nkv = 8, hd = 128;
  std::printf("\n%-44s %10s %10s\n", "attention prefill (causal, 32/8 heads, hd128, bf16)", "ms", "TFLOP/s");
  for (int seq : {4096, 16384}) {
    be.kv_allocate({1, nkv, hd, seq, DType::BF16});
    auto qb = be.alloc(size_t(seq) * nh * hd * 2), ob = be.alloc(size_t(seq) * nh * hd * 2), pb = be.alloc(4);
    {
      std::normal_distribution<float> nd;
      std::vector<uint16_t> h(size_t(seq) * nh * hd);
      for (auto& v : h) v = f32_to_bf16(nd(g));
      be.upload(qb->data(), h.data(), h.size() * 2);
      const int32_t zero = 0;
      be.upload(pb->data(), &zero, 4);
      Act kv = qb->as_act(DType::BF16, seq, nkv * hd);  // the first seq*nkv*hd random values
      be.kv_write(0, kv, kv, StepState{static_cast<int32_t*>(pb->data()), 0});
      be.sync();
    }
    Act q = qb->as_act(DType::BF16, seq, nh * hd), o = ob->as_act(DType::BF16, seq, nh * hd);
    const StepState st{static_cast<int32_t*>(pb->data()), 0};
    const double flops = 4.0 * double(seq) * seq / 2 * hd * nh;
    // flash twice on Hopper builds: the mma.sync kernel and the wgmma one (the default there;
    // NF4FLASH_FLASH_KERNEL picks), named flash-mma / flash-wgmma
    std::vector<std::pair<AttnImpl, const char*>> runs = {{AttnImpl::Flash, "mma"}};
    if (cuda::attention_flash_wgmma_supported()) {
      runs.push_back({AttnImpl::Flash, "wgmma"});
      runs.push_back({AttnImpl::Flash, "wgmma-serial"});
    }
    runs.push_back({AttnImpl::Sdpa, ""});
    runs.push_back({AttnImpl::Eager, ""});
    for (auto [impl, kern] : runs) {
      const bool fl = *kern != 0;
      if (fl) setenv("NF4FLASH_FLASH_KERNEL", kern, 1);
      const std::string name = cat("attn prefill ", attn_impl_name(impl), fl ? "-" : "", kern, " seq=", seq);
      const AttnParams ap{nh, nkv, hd, 1.f / std::sqrt(float(hd)), impl};
      std::vector<double> t;
      for (int k = 0; k <= trials; ++k) {
        be.sync();
        const auto t0 = std::chrono::steady_clock::now();
        be.attention(0, q, o, ap, st);
        be.sync();
        if (k > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      const double sec = median(t);
      std::printf("%-44s %10.3f %10.1f\n", name.c_str(), sec * 1e3, flops / sec / 1e12);
      rows.push_back({{"name", name}, {"impl", std::string(attn_impl_name(impl))}, {"seq", seq}, {"n_heads", nh},
                      {"n_kv_heads", nkv}, {"head_dim", hd}, {"dtype", "bf16"}, {"causal", true}, {"ms", sec * 1e3},
                      {"flops", flops}, {"tflops", flops / sec / 1e12}, {"trials", trials}, {"kernel", kern}});
      if (fl) unsetenv("NF4FLASH_FLASH_KERNEL");
    }
  }
  return rows;
}

}  // namespace nf4flash::kbench
