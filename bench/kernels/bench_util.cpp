// nf4flash-kernel-bench: the helpers every section uses (bench.h): the report table, graph-replay
// and per-call timing, and random 4-bit / bf16 weights and activations.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "bench.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace nf4flash::kbench {

std::unique_ptr<Backend> Context::backend_with(const std::function<void(CudaTuning&)>& edit) const {
  CudaBackendOptions o = options;
  CudaTuning t = o.tuning.value_or(cuda_tuning_current());
  edit(t);
  o.tuning = t;
  return make_cuda_backend(o);
}

namespace {

constexpr const char* kRowFmt = "%-58s %10s %9s %7s %9s\n";

std::string fmt(const char* f, double v) {
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// splitmix64: a fast generator for hundreds of MB of random bytes
uint64_t mix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void fill_bytes(std::vector<uint8_t>& v, uint64_t seed) {
  for (size_t i = 0; i < v.size(); i += 8) {
    const uint64_t r = mix(seed);
    for (size_t k = 0; k < 8 && i + k < v.size(); ++k) v[i + k] = uint8_t(r >> (8 * k));
  }
}

}  // namespace

void Report::section(const std::string& id, const std::string& title) {
  section_ = id;
  std::printf("\n== %s ==\n", title.c_str());
  std::printf(kRowFmt, "kernel", "us", "GB/s", "%copy", "TFLOP/s");
  std::fflush(stdout);
}

void Report::row(const std::string& name, double sec, double bytes, double flops, nlohmann::json extra) {
  const double gbs = bytes > 0 ? bytes / sec / 1e9 : 0, tflops = flops > 0 ? flops / sec / 1e12 : 0;
  const double pct = copy_gbs_ > 0 ? 100.0 * gbs / copy_gbs_ : 0;
  std::printf(kRowFmt, name.c_str(), fmt(sec < 1e-3 ? "%.2f" : "%.1f", sec * 1e6).c_str(),
              bytes > 0 ? fmt("%.1f", gbs).c_str() : "-", bytes > 0 && copy_gbs_ > 0 ? fmt("%.1f", pct).c_str() : "-",
              flops > 0 ? fmt("%.1f", tflops).c_str() : "-");
  std::fflush(stdout);
  extra["name"] = name;
  extra["section"] = section_;
  extra["us"] = sec * 1e6;
  if (bytes > 0) {
    extra["bytes"] = bytes;
    extra["gb_per_s"] = gbs;
    extra["pct_of_copy"] = pct;
  }
  if (flops > 0) {
    extra["flops"] = flops;
    extra["tflops"] = tflops;
  }
  rows_.push_back(std::move(extra));
}

int Context::copies_for(double bytes) const {
  return int(std::max(2.0, std::floor(4.0 * double(prop.l2CacheSize) / bytes) + 1));
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

double median(std::vector<double> v) {
  NF4FLASH_CHECK(!v.empty(), "median of no samples");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double time_graph(Backend& be, const std::function<void(int)>& body, int reps, int trials) {
  body(0);
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

double time_calls(Backend& be, const std::function<void()>& call, int trials) {
  std::vector<double> t;
  for (int k = 0; k <= trials; ++k) {
    be.sync();
    const auto t0 = std::chrono::steady_clock::now();
    call();
    be.sync();
    if (k > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(t);
}

std::shared_ptr<const Quant4Tensor> random_q4(int64_t rows, int64_t cols, bool double_quant, std::mt19937_64& g) {
  static constexpr float kNf4[16] = {-1.0f,       -0.6961928f, -0.5250731f, -0.3949175f, -0.2844414f, -0.1848089f,
                                     -0.0910500f, 0.0f,        0.0795803f,  0.1609302f,  0.2461123f,  0.3379152f,
                                     0.4407098f,  0.5626170f,  0.7229568f,  1.0f};
  auto q = std::make_shared<Quant4Tensor>();
  q->type = QuantType::NF4;
  q->rows = rows;
  q->cols = cols;
  q->blocksize = 64;
  std::copy(std::begin(kNf4), std::end(kNf4), q->code.begin());
  q->packed.resize(size_t(rows * cols / 2));
  fill_bytes(q->packed, g());
  const int64_t nb = q->num_blocks();
  std::uniform_real_distribution<float> u(0.01f, 0.1f);
  if (!double_quant) {
    q->absmax.resize(size_t(nb));
    for (auto& a : q->absmax) a = u(g);
    return q;
  }
  q->double_quant = true;
  q->absmax_q.resize(size_t(nb));
  fill_bytes(q->absmax_q, g());
  q->nested_absmax.resize(size_t((nb + q->nested_blocksize - 1) / q->nested_blocksize));
  for (auto& a : q->nested_absmax) a = u(g);
  for (int i = 0; i < 256; ++i) q->nested_code[size_t(i)] = -1.f + 2.f * float(i) / 255.f;
  q->offset = 0.05f;
  return q;
}

std::vector<uint16_t> bf16_pattern(size_t n, uint64_t seed) {
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(float(int((seed + i) * 2654435761u % 2001) - 1000) * 1e-5f);
  return h;
}

std::unique_ptr<Weight> upload_bf16(Backend& be, int64_t rows, int64_t cols, const std::vector<uint16_t>& bits) {
  NF4FLASH_CHECK(bits.size() == size_t(rows * cols), "upload_bf16: ", bits.size(), " values for [", rows, ", ",
                 cols, "]");
  TensorInfo ti;
  ti.name = "bench weight";
  ti.dtype = DType::BF16;
  ti.shape = {rows, cols};
  ti.data = reinterpret_cast<const uint8_t*>(bits.data());
  ti.nbytes = bits.size() * 2;
  return be.upload_dense(ti, DType::BF16);
}

std::unique_ptr<Buffer> randn_bf16(Backend& be, size_t n, std::mt19937_64& g) {
  std::normal_distribution<float> nd;
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = f32_to_bf16(nd(g));
  auto b = be.alloc(n * 2);
  be.upload(b->data(), h.data(), n * 2);
  be.sync();  // other backends (streams) of the same device may read it next
  return b;
}

}  // namespace nf4flash::kbench
