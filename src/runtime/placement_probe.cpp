#include "runtime/placement_probe.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/weight_loader.h"

namespace nf4flash {

namespace {

// A layer's linear weights (q, k, v, o, gate, up, down: "probe.<name>") as bf16 tensors of small
// pseudo-random values, for load_linear_weight; all of them view one buffer of the largest's size.
class ProbeStore : public WeightStore {
 public:
  ProbeStore(const std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>>& shapes) {
    source_ = "placement probe";
    size_t most = 0;
    for (const auto& [name, rc] : shapes) most = std::max(most, size_t(rc.first * rc.second));
    data_.resize(most);
    uint32_t s = 0x9e3779b9u;
    for (uint16_t& v : data_) {
      s = s * 1664525u + 1013904223u;
      v = f32_to_bf16((static_cast<float>(s >> 8) / 16777216.0f - 0.5f) * 0.05f);
    }
    for (const auto& [name, rc] : shapes) {
      TensorInfo t;
      t.name = "probe." + name;
      t.dtype = DType::BF16;
      t.shape = {rc.first, rc.second};
      t.data = reinterpret_cast<const uint8_t*>(data_.data());
      t.nbytes = size_t(rc.first * rc.second) * 2;
      t.file = source_;
      tensors_[t.name] = t;
    }
  }
  const TensorInfo* find(const std::string& name) const override {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [k, v] : tensors_) n.push_back(k);
    return n;
  }

 private:
  std::vector<uint16_t> data_;
  std::map<std::string, TensorInfo> tensors_;
};

// Seconds per call of f, after one untimed call, over `reps` calls (the backend synchronized).
template <class F>
double seconds_per(Backend& be, int reps, F&& f) {
  f();
  be.sync();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  be.sync();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// The median of `rounds` timings of one call of f (after an untimed one; f returns when its work
// is done): a round that a busy neighbour slowed does not set the rate.
template <class F>
double median_seconds(int rounds, F&& f) {
  std::vector<double> s;
  f();
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}
// The same for f's ops on a backend (synchronized after each call).
template <class F>
double median_seconds(Backend& be, int rounds, F&& f) {
  return median_seconds(rounds, [&] {
    f();
    be.sync();
  });
}

// How many copies of a probe's weights to cycle through so that they read past the host's caches
// (a decode step streams every layer's weights once; some server CPUs have 300+ MiB of L3).
int copies_past_caches(size_t bytes) {
  constexpr size_t kPastCaches = size_t(2) << 30;
  return int(std::clamp<size_t>((kPastCaches + bytes - 1) / std::max<size_t>(bytes, 1), 1, 16));
}

}  // namespace

BackendRates probe_backend(Backend& be, const ModelConfig& cfg, const WeightPolicy& p, int64_t prompt_rows) {
  const int64_t H = cfg.hidden_size, qd = int64_t(cfg.n_heads) * cfg.head_dim, kvd = int64_t(cfg.n_kv_heads) * cfg.head_dim;
  const int64_t I = cfg.intermediate_size > 0 ? cfg.intermediate_size : cfg.moe.expert_intermediate;
  const std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> shapes = {
      {"q", {qd, H}}, {"k", {kvd, H}}, {"v", {kvd, H}}, {"o", {H, qd}}, {"gate", {I, H}}, {"up", {I, H}}, {"down", {H, I}}};
  const ProbeStore store(shapes);
  const bool gpu = be.device() == Device::CUDA;
  struct Lin {
    std::unique_ptr<Weight> w;
    int64_t rows, cols;
  };
  // layers[c]: copy c of a layer's linears. The GPU reads one copy (its L2 is far smaller than a
  // layer); the CPU cycles through enough copies to stream from memory as a decode step does.
  std::vector<std::vector<Lin>> layers(1);
  size_t layer_bytes = 0;
  double layer_flop_per_row = 0;
  for (const auto& [name, rc] : shapes) {
    layers[0].push_back({load_linear_weight(be, store, "probe." + name, rc.first, rc.second, p, true), rc.first, rc.second});
    layer_bytes += layers[0].back().w->resident_bytes();
    layer_flop_per_row += 2.0 * double(rc.first) * double(rc.second);
  }
  const int n_layers = gpu ? 1 : copies_past_caches(layer_bytes);
  for (int c = 1; c < n_layers; ++c) {
    layers.emplace_back();
    for (const auto& [name, rc] : shapes)
      layers.back().push_back({load_linear_weight(be, store, "probe." + name, rc.first, rc.second, p, true), rc.first, rc.second});
  }
  WeightPolicy dense = p;
  dense.quant = QuantType::None;
  std::vector<std::unique_ptr<Weight>> w_dense;
  w_dense.push_back(load_linear_weight(be, store, "probe.gate", I, H, dense, false));
  const int n_dense = gpu ? 1 : copies_past_caches(w_dense[0]->resident_bytes());
  while (int(w_dense.size()) < n_dense) w_dense.push_back(load_linear_weight(be, store, "probe.gate", I, H, dense, false));

  const DType adt = be.act_dtype();
  const int64_t T = std::max<int64_t>(prompt_rows, 1), widest = std::max({H, qd, I});
  auto xb = be.alloc(size_t(T * widest) * dtype_size(adt));
  auto yb = be.alloc(size_t(T * widest) * dtype_size(adt));
  const std::vector<uint8_t> zeros(xb->bytes(), 0);
  be.upload(xb->data(), zeros.data(), zeros.size());
  // copy c's linears over `rows` rows (as a decode step issues them, in order)
  auto run_layer = [&](int c, int64_t rows) {
    for (const Lin& l : layers[size_t(c)])
      be.linear(xb->as_act(adt, rows, l.cols), *l.w, nullptr, yb->as_act(adt, rows, l.rows));
  };

  BackendRates r;
  if (be.graphs_supported()) {  // the decode step replays a graph: no launch gaps
    be.capture_begin();
    run_layer(0, 1);
    const int g = be.capture_end();
    r.gemv_bytes_s = layer_bytes / seconds_per(be, 20, [&] { be.replay(g); });
  } else {
    const double s = median_seconds(be, 5, [&] {
      for (int c = 0; c < n_layers; ++c) run_layer(c, 1);
    });
    r.gemv_bytes_s = double(layer_bytes) * n_layers / s;
  }
  const Act x1 = xb->as_act(adt, 1, H), y1 = yb->as_act(adt, 1, I);
  const double dense_s = median_seconds(be, gpu ? 20 : 5, [&] {
    for (const auto& w : w_dense) be.linear(x1, *w, nullptr, y1);
  });
  r.gemv_dense_bytes_s = double(w_dense[0]->resident_bytes()) * n_dense / dense_s;
  r.gemm_flop_s = layer_flop_per_row * double(T) / seconds_per(be, gpu ? 5 : 1, [&] { run_layer(0, T); });
  // a small op: the residual add of one row
  const Act h = xb->as_act(adt, 1, H);
  constexpr int kOps = 200;
  r.op_s = seconds_per(be, 1, [&] { for (int i = 0; i < kOps; ++i) be.add(h, h, h); }) / kOps;
  r.op_graph_s = r.op_s;
  if (be.graphs_supported()) {
    be.capture_begin();
    for (int i = 0; i < kOps; ++i) be.add(h, h, h);
    const int g = be.capture_end();
    r.op_graph_s = seconds_per(be, 5, [&] { be.replay(g); }) / kOps;
  }
  return r;
}

TransferRate probe_transfer(Backend& gpu, size_t bytes) {
  std::vector<uint8_t> host(std::max<size_t>(bytes, 4), 1);
  auto dev = gpu.alloc(host.size());
  const auto trip = [&](size_t n) {
    gpu.upload(dev->data(), host.data(), n);
    gpu.download(host.data(), dev->data(), n);
  };
  TransferRate t;
  t.latency_s = seconds_per(gpu, 50, [&] { trip(4); });
  const double s = seconds_per(gpu, 10, [&] { trip(host.size()); });
  t.bytes_s = 2.0 * host.size() / std::max(s - t.latency_s, 1e-9);
  return t;
}

double probe_host_read(int threads) {
  const size_t n = (size_t(1) << 30) / 8;  // past the caches of server CPUs (300+ MiB of L3)
  std::vector<uint64_t> buf(n, 1);  // written once: the pages exist before the timing
  ThreadPool pool(threads > 0 ? threads : num_threads());
  std::vector<uint64_t> sums(size_t(pool.size()) * 8, 0);
  std::atomic<int> slot{0};
  auto read_all = [&] {
    slot = 0;
    pool.parallel_for(int64_t(n), int64_t(1) << 20, [&](int64_t b, int64_t e) {
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b; i + 3 < e; i += 4) {
        s0 += buf[size_t(i)];
        s1 += buf[size_t(i) + 1];
        s2 += buf[size_t(i) + 2];
        s3 += buf[size_t(i) + 3];
      }
      sums[size_t(slot++ % int(sums.size()))] += s0 + s1 + s2 + s3;
    });
  };
  const double s = median_seconds(5, read_all);
  volatile uint64_t keep = 0;
  for (uint64_t v : sums) keep = keep + v;  // the sums are used: the reads stay
  return double(n) * 8 / s;
}

PlacementPrediction predict_placement(const Placement& pl, const ModelBytes& m, const ModelConfig& cfg,
                                      const BackendRates& gpu, const BackendRates& cpu, const TransferRate& link,
                                      int64_t ctx, int64_t prompt, bool graphs) {
  PlacementPrediction p;
  const bool all_cpu = pl.gpu_layers == 0;
  const BackendRates& head_be = all_cpu ? cpu : gpu;
  double gpu_s = 0, cpu_s = 0, gpu_flop = 0, cpu_flop = 0;
  for (int i = 0; i < pl.n_layers; ++i) {
    const bool on_gpu = i < pl.gpu_layers;
    const BackendRates& r = on_gpu ? gpu : cpu;
    const size_t kv = (on_gpu ? m.kv_token_layer : m.kv_token_layer_host) * size_t(ctx);
    const double s = m.layer_read[size_t(i)] / r.gemv_bytes_s + kv / r.gemv_dense_bytes_s +
                     kOpsPerLayer * (on_gpu && graphs ? r.op_graph_s : r.op_s);
    (on_gpu ? gpu_s : cpu_s) += s;
    (on_gpu ? gpu_flop : cpu_flop) += 2.0 * double(m.layer_params[size_t(i)]) * double(prompt);
  }
  const size_t head = m.head ? m.head : m.embed;
  const double head_s = head / (m.head_quant4 ? head_be.gemv_bytes_s : head_be.gemv_dense_bytes_s);
  (all_cpu ? cpu_s : gpu_s) += head_s;
  double hop_s = 0, hop_prefill_s = 0;
  if (pl.offloaded() && !all_cpu) {
    const double row = double(cfg.hidden_size) * 4;  // f32 on the host side
    hop_s = 2 * (link.latency_s + row / link.bytes_s);
    hop_prefill_s = 2 * (link.latency_s + row * double(prompt) / link.bytes_s);
  }
  p.gpu_ms = gpu_s * 1e3;
  p.cpu_ms = cpu_s * 1e3;
  p.hop_ms = hop_s * 1e3;
  p.decode_ms = p.gpu_ms + p.cpu_ms + p.hop_ms;
  const double gpu_rate = all_cpu ? cpu.gemm_flop_s : gpu.gemm_flop_s;
  p.ttft_ms = ((gpu_flop > 0 ? gpu_flop / gpu_rate : 0) + (cpu_flop > 0 ? cpu_flop / cpu.gemm_flop_s : 0) + head_s + hop_prefill_s) * 1e3;
  return p;
}

std::string describe_placement(const Placement& pl) {
  const auto gib = [](size_t b) { return cat(std::round(b / double(1 << 30) * 100) / 100, " GiB"); };
  if (!pl.offloaded())
    return cat("all ", pl.n_layers, " layers on the GPU (", gib(pl.gpu_weights), " + KV ", gib(pl.gpu_kv), ")");
  if (pl.gpu_layers == 0) return cat("all ", pl.n_layers, " layers on the CPU (", gib(pl.cpu_weights), " + KV ", gib(pl.cpu_kv), ")");
  return cat(pl.gpu_layers, " of ", pl.n_layers, " layers on the GPU (", gib(pl.gpu_weights), " + KV ", gib(pl.gpu_kv), "), ",
             pl.n_layers - pl.gpu_layers, " on the CPU (", gib(pl.cpu_weights), " + KV ", gib(pl.cpu_kv), ")");
}

}  // namespace nf4flash
