// CPU backend: the f32 reference every faster path is checked against, and a usable engine.
// Activations and arithmetic are f32. Compute bf16 means bf16 weights: dense weights stay bf16 in
// memory and 4-bit weights dequantize to bf16 values (as bitsandbytes does for a bf16 compute
// dtype) before the f32 multiply-add.
// Weights: dense f32 or bf16, or bitsandbytes 4-bit (fused dequant matmul, no full-size copy).
// KV cache: f32, [layer][kv_head][capacity][head_dim] for K and for V.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/matmul_dense.h"
#include "backend/cpu/matmul_q4.h"
#include "backend/cpu/matmul_q4_bf16.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "sampling/sampler.h"

namespace nf4flash {
namespace {

class CpuBuffer final : public Buffer {
 public:
  explicit CpuBuffer(size_t bytes) {
    bytes_ = bytes;
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    data_ = std::aligned_alloc(64, rounded);
    if (!data_) fail("out of host memory allocating ", bytes, " bytes");
  }
  ~CpuBuffer() override { std::free(data_); }
};

class CpuDense final : public Weight {
 public:
  CpuDense(const TensorInfo& t, DType store) {
    kind_ = Kind::Dense;
    if (t.shape.size() == 1) {
      rows_ = 1;
      cols_ = t.shape[0];
    } else if (t.shape.size() == 2) {
      rows_ = t.shape[0];
      cols_ = t.shape[1];
    } else {
      fail(t.file, ": tensor ", t.name, " has shape ", t.shape_str(), ", expected 1 or 2 dims");
    }
    const int64_t n = rows_ * cols_;
    if (store != DType::F32 && store != DType::BF16) store = DType::F32;
    dtype_ = store;
    if (store == DType::BF16 && t.dtype == DType::BF16) {
      bf16_.assign(reinterpret_cast<const uint16_t*>(t.data), reinterpret_cast<const uint16_t*>(t.data) + n);
    } else {
      std::vector<float> tmp(n);
      const uint8_t* p = t.data;
      for (int64_t i = 0; i < n; ++i) {
        switch (t.dtype) {
          case DType::F32: std::memcpy(&tmp[i], p + 4 * i, 4); break;
          case DType::BF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); tmp[i] = bf16_to_f32(h); break; }
          case DType::F16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); tmp[i] = f16_to_f32(h); break; }
          default: fail(t.file, ": tensor ", t.name, " has dtype ", dtype_name(t.dtype), ", expected a float type");
        }
      }
      if (store == DType::BF16) {
        bf16_.resize(n);
        for (int64_t i = 0; i < n; ++i) bf16_[i] = f32_to_bf16(tmp[i]);
      } else {
        f32_ = std::move(tmp);
      }
    }
    bytes_ = f32_.size() * 4 + bf16_.size() * 2;
  }
  float at(int64_t i) const { return dtype_ == DType::F32 ? f32_[i] : bf16_to_f32(bf16_[i]); }
  void row(int64_t r, float* out) const {
    for (int64_t c = 0; c < cols_; ++c) out[c] = at(r * cols_ + c);
  }
  const float* f32() const { return f32_.data(); }
  const uint16_t* bf16() const { return bf16_.data(); }

 private:
  std::vector<float> f32_;
  std::vector<uint16_t> bf16_;
};

// A 4-bit weight: the bitsandbytes layout (compute f32, the exact path), or only its bf16 panels
// (compute bf16, where the bf16 kernel exists and the shape suits it).
class CpuQuant4 final : public Weight {
 public:
  CpuQuant4(std::shared_ptr<const Quant4Tensor> q, bool panels) {
    kind_ = Kind::Quant4;
    dtype_ = q->orig_dtype;
    quant_ = q->type;
    double_quant_ = q->double_quant;
    rows_ = q->rows;
    cols_ = q->cols;
    if (panels) {
      panels_ = std::make_unique<Q4Panels>(pack_q4_panels(*q));
      bytes_ = panels_->resident_bytes();
    } else {
      q_ = std::move(q);
      bytes_ = q_->resident_bytes();
    }
  }
  const Quant4Tensor* q() const { return q_.get(); }
  const Q4Panels* panels() const { return panels_.get(); }

 private:
  std::shared_ptr<const Quant4Tensor> q_;
  std::unique_ptr<Q4Panels> panels_;
};

float* f32p(Act& a) { return static_cast<float*>(a.data); }

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& o) : compute_(o.compute) {
    if (o.compute != DType::F32 && o.compute != DType::BF16)
      fail("--compute-dtype ", dtype_name(o.compute), " is not supported on the CPU backend (use f32 or bf16)");
    if (o.threads > 0) set_num_threads(o.threads);
  }

  Device device() const override { return Device::CPU; }
  std::string name() const override {
    std::string simd =
#if defined(__AVX512F__)
        "avx512";
#elif defined(__AVX2__)
        "avx2";
#else
        "scalar";
#endif
    return cat("cpu (", num_threads(), " threads, ", simd, ", compute ", dtype_name(compute_), ")");
  }
  DType act_dtype() const override { return DType::F32; }

  std::unique_ptr<Buffer> alloc(size_t bytes) override { return std::make_unique<CpuBuffer>(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void sync() override {}

  // The pipelined decode interface, run in the call (backend memory is host memory): the same id
  // as sampling on the host. Not the engine's default on the CPU (pipelines_decode() is false).
  bool sample_to_device(Act logits, const SamplingParams& p, float uniform, int32_t* next_id, int32_t* pos,
                        int slot, int32_t* history, int32_t* history_count, int history_capacity) override {
    NF4FLASH_CHECK(logits.dtype == DType::F32 && logits.rows == 1, "sample_to_device: logits must be F32 [1, vocab]");
    NF4FLASH_CHECK(slot >= 0 && slot < kSampleSlots, "sample_to_device: slot ", slot, " out of range");
    NF4FLASH_CHECK(p.repeat_penalty == 1.0f || (history && history_count && history_capacity > 0),
                   "sample_to_device: the repetition penalty needs the history in backend memory");
    std::vector<int32_t> hist;
    if (history) hist.assign(history, history + std::clamp(*history_count, 0, history_capacity));
    const int32_t id = sample_with_uniform(static_cast<const float*>(logits.data), logits.cols, p, hist,
                                           p.greedy() ? 0.0f : uniform);
    *next_id = id;
    *pos += 1;
    if (history && *history_count < history_capacity) history[(*history_count)++] = id;
    slots_[slot] = id;
    return true;
  }
  int32_t sampled(int slot) override {
    NF4FLASH_CHECK(slot >= 0 && slot < kSampleSlots, "sampled: slot ", slot, " out of range");
    return slots_[slot];
  }

  std::unique_ptr<Weight> upload_dense(const TensorInfo& t, DType store) override {
    return std::make_unique<CpuDense>(t, store);
  }
  std::unique_ptr<Weight> upload_quant4(std::shared_ptr<const Quant4Tensor> q) override {
    const bool panels = compute_ == DType::BF16 && q4_bf16_supported(*q);
    return std::make_unique<CpuQuant4>(std::move(q), panels);
  }

  void embed(const Weight& table, const int32_t* ids, Act out, int64_t shard_row0) override {
    const auto& d = dense(table, "embed");
    NF4FLASH_CHECK(d.cols() == out.cols, "embed: table width ", d.cols(), " != ", out.cols);
    for (int64_t t = 0; t < out.rows; ++t) {
      float* o = f32p(out) + t * out.cols;
      if (shard_row0 >= 0) {
        NF4FLASH_CHECK(ids[t] >= 0, "token id ", ids[t], " is negative");
        const int64_t r = ids[t] - shard_row0;
        if (r >= 0 && r < d.rows()) d.row(r, o);
        else std::fill(o, o + out.cols, 0.0f);
        continue;
      }
      NF4FLASH_CHECK(ids[t] >= 0 && ids[t] < d.rows(), "token id ", ids[t], " is outside the vocabulary (size ", d.rows(), ")");
      d.row(ids[t], o);
    }
  }

  void rms_norm(Act x, const Weight& w, float eps, Act out) override {
    const auto& d = dense(w, "rms_norm");
    NF4FLASH_CHECK(d.rows() * d.cols() == x.cols, "rms_norm: weight has ", d.rows() * d.cols(), " entries, rows have ", x.cols);
    thread_pool().parallel_for(x.rows, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = f32p(x) + r * x.cols;
        float* yr = f32p(out) + r * out.cols;
        double ss = 0;
        for (int64_t c = 0; c < x.cols; ++c) ss += static_cast<double>(xr[c]) * xr[c];
        const float inv = 1.0f / std::sqrt(static_cast<float>(ss / x.cols) + eps);
        for (int64_t c = 0; c < x.cols; ++c) yr[c] = xr[c] * inv * d.at(c);
      }
    });
  }

  void linear_group(const Act* xs, const LinearOut* outs, int n) override {
    std::vector<Q4Product> ps;
    for (int i = 0; i < n; ++i) {
      const Weight& w = *outs[i].w;
      const Q4Panels* p = w.kind() == Weight::Kind::Quant4 ? static_cast<const CpuQuant4&>(w).panels() : nullptr;
      if (!p || outs[i].bias || xs[i].cols != w.cols() || outs[i].out.cols != w.rows() || xs[i].rows != outs[i].out.rows)
        return Backend::linear_group(xs, outs, n);  // the same products, one at a time
      ps.push_back({f32p(const_cast<Act&>(xs[i])), xs[i].rows, p, static_cast<float*>(outs[i].out.data)});
    }
    q4_bf16_matmul_group(ps.data(), n);
  }

  void linear(Act x, const Weight& w, const Weight* bias, Act out) override {
    NF4FLASH_CHECK(x.cols == w.cols() && out.cols == w.rows() && x.rows == out.rows,
                   "linear: shapes x[", x.rows, ",", x.cols, "] W[", w.rows(), ",", w.cols(), "] out[", out.rows, ",", out.cols, "]");
    NF4FLASH_CHECK(out.dtype == DType::F32, "cpu linear: output must be f32");
    if (w.kind() == Weight::Kind::Quant4) {
      const auto& q = static_cast<const CpuQuant4&>(w);
      if (q.panels()) q4_bf16_matmul(f32p(x), x.rows, *q.panels(), f32p(out));
      else cpu_matmul_q4(f32p(x), x.rows, *q.q(), f32p(out), compute_ != DType::F32);
    } else {
      const auto& d = static_cast<const CpuDense&>(w);
      if (d.dtype() == DType::F32) cpu_matmul_f32(f32p(x), x.rows, d.f32(), d.rows(), d.cols(), f32p(out));
      else cpu_matmul_bf16(f32p(x), x.rows, d.bf16(), d.rows(), d.cols(), f32p(out));
    }
    if (bias) {
      const auto& b = dense(*bias, "bias");
      NF4FLASH_CHECK(b.rows() * b.cols() == out.cols, "linear: bias size mismatch");
      for (int64_t r = 0; r < out.rows; ++r)
        for (int64_t c = 0; c < out.cols; ++c) f32p(out)[r * out.cols + c] += b.at(c);
    }
  }

  void rope(Act q, Act k, const RopeParams& p, const StepState& s) override {
    const int hd = p.head_dim, half = hd / 2;
    const std::vector<RowAt> at = rows_of(q.rows, s, /*cache=*/false);
    std::map<int64_t, std::vector<float>> dyn;  // dynamic NTK: a table per forward end past the limit
    if (p.dynamic_table)
      for (const RowAt& r : at)
        if (r.end > p.dynamic_after && !dyn.count(r.end)) {
          std::vector<float>& tab = dyn[r.end];
          tab.assign(size_t(half), 0.0f);
          p.dynamic_table(r.end, tab.data());
        }
    auto apply = [&](Act a) {
      const int64_t heads = a.cols / hd;
      for (int64_t t = 0; t < a.rows; ++t) {
        const float pos = static_cast<float>(at[size_t(t)].pos);
        const int64_t end = at[size_t(t)].end;
        const float* inv = p.inv_freq_long && end > p.long_after ? p.inv_freq_long
                           : p.dynamic_table && end > p.dynamic_after ? dyn.at(end).data()
                                                                       : p.inv_freq;
        for (int i = 0; i < half; ++i) {
          const float ang = pos * inv[i];
          float c = std::cos(ang), sn = std::sin(ang);
          if (p.mscale != 1.0f) {
            c *= p.mscale;
            sn *= p.mscale;
          }
          for (int64_t h = 0; h < heads; ++h) {
            float* v = f32p(a) + t * a.cols + h * hd;
            const float x1 = v[i], x2 = v[i + half];
            v[i] = x1 * c - x2 * sn;
            v[i + half] = x2 * c + x1 * sn;
          }
        }
      }
    };
    apply(q);
    apply(k);
  }

  void kv_allocate(const KVCacheDesc& d) override {
    ++kv_epoch_;
    kv_ = d;
    kv_.dtype = DType::F32;
    paged_ = false;
    const size_t n = static_cast<size_t>(d.n_layers) * d.n_kv_heads * d.capacity * d.head_dim;
    k_cache_.assign(n, 0.0f);
    v_cache_.assign(n, 0.0f);
  }
  const KVCacheDesc& kv_desc() const override { return kv_; }
  size_t kv_bytes() const override { return (k_cache_.size() + v_cache_.size()) * 4; }

  // The paged cache: [layer][block][kv head][slot][head_dim], f32.
  void kv_allocate_paged(const KVCacheDesc& d, int64_t n_blocks, int block_size) override {
    NF4FLASH_CHECK(n_blocks > 0 && block_size > 0, "paged KV cache: ", n_blocks, " blocks of ", block_size, " positions");
    kv_ = d;
    kv_.dtype = DType::F32;
    kv_.capacity = n_blocks * block_size;
    paged_ = true;
    n_blocks_ = n_blocks;
    block_size_ = block_size;
    const size_t n = static_cast<size_t>(d.n_layers) * n_blocks * d.n_kv_heads * block_size * d.head_dim;
    k_cache_.assign(n, 0.0f);
    v_cache_.assign(n, 0.0f);
  }

  void gather_rows(Act x, const int32_t* rows, Act out) override {
    NF4FLASH_CHECK(out.cols == x.cols, "gather_rows: widths ", x.cols, " and ", out.cols, " differ");
    for (int64_t i = 0; i < out.rows; ++i) {
      NF4FLASH_CHECK(rows[i] >= 0 && rows[i] < x.rows, "gather_rows: row ", rows[i], " of ", x.rows);
      std::memmove(f32p(out) + i * out.cols, f32p(x) + int64_t(rows[i]) * x.cols, size_t(x.cols) * 4);
    }
  }

  void kv_write(int layer, Act k, Act v, const StepState& s) override {
    const int hd = kv_.head_dim;
    const std::vector<RowAt> at = rows_of(k.rows, s);
    for (int64_t t = 0; t < k.rows; ++t)
      for (int g = 0; g < kv_.n_kv_heads; ++g) {
        std::memcpy(kv_at(k_cache_, layer, g, s, at[size_t(t)]), f32p(k) + t * k.cols + g * hd, hd * 4);
        std::memcpy(kv_at(v_cache_, layer, g, s, at[size_t(t)]), f32p(v) + t * v.cols + g * hd, hd * 4);
      }
  }

  void attention(int layer, Act q, Act out, const AttnParams& p, const StepState& s) override {
    const int hd = p.head_dim, group = p.n_heads / p.n_kv_heads;
    const std::vector<RowAt> at = rows_of(q.rows, s);
    int64_t longest = 0;
    for (const RowAt& r : at) longest = std::max(longest, r.pos + 1);
    thread_pool().parallel_for(q.rows * p.n_heads, 1, [&](int64_t i0, int64_t i1) {
      std::vector<float> sc(static_cast<size_t>(longest));
      std::vector<double> acc(hd);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t t = i / p.n_heads;
        const int h = static_cast<int>(i % p.n_heads), g = h / group;
        const float* qv = f32p(q) + t * q.cols + h * hd;
        const RowAt& r = at[size_t(t)];
        const int64_t n = r.pos + 1, j0 = p.window > 0 ? std::max<int64_t>(0, n - p.window) : 0;
        float mx = -INFINITY;
        for (int64_t j = j0; j < n; ++j) {
          const float* kr = kv_at(k_cache_, layer, g, s, {r.seq, j});
          float d = 0;
          for (int c = 0; c < hd; ++c) d += qv[c] * kr[c];
          sc[j] = d * p.scale;
          if (p.softcap > 0) sc[j] = std::tanh(sc[j] / p.softcap) * p.softcap;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (int64_t j = j0; j < n; ++j) sum += (sc[j] = std::exp(sc[j] - mx));
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = j0; j < n; ++j) {
          const float w = static_cast<float>(sc[j] / sum);
          const float* vr = kv_at(v_cache_, layer, g, s, {r.seq, j});
          for (int c = 0; c < hd; ++c) acc[c] += static_cast<double>(w) * vr[c];
        }
        float* o = f32p(out) + t * out.cols + h * hd;
        for (int c = 0; c < hd; ++c) o[c] = static_cast<float>(acc[c]);
      }
    });
  }

  void silu_mul(Act gate, Act up, Act out) override {
    const float* g = f32p(gate);
    const float* u = f32p(up);
    float* o = f32p(out);
    thread_pool().parallel_for(out.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    });
  }

  // gelu_pytorch_tanh(g) * u: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u
  void gelu_tanh_mul(Act gate, Act up, Act out) override {
    const float* g = f32p(gate);
    const float* u = f32p(up);
    float* o = f32p(out);
    const float k = 0.7978845608028654f;
    thread_pool().parallel_for(out.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = 0.5f * g[i] * (1.0f + std::tanh(k * (g[i] + 0.044715f * g[i] * g[i] * g[i]))) * u[i];
    });
  }
  void scale(Act x, float sc) override {
    float* v = f32p(x);
    for (int64_t i = 0; i < x.numel(); ++i) v[i] *= sc;
  }
  void softcap(Act x, float c) override {
    float* v = f32p(x);
    for (int64_t i = 0; i < x.numel(); ++i) v[i] = std::tanh(v[i] / c) * c;
  }

  void add(Act a, Act b, Act out) override {
    const float* x = f32p(a);
    const float* y = f32p(b);
    float* o = f32p(out);
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = x[i] + y[i];
  }

  std::string attn_unsupported_reason(AttnImpl impl, int head_dim) const override {
    if (impl == AttnImpl::Auto || impl == AttnImpl::Eager) return "";
    return cat("--attn ", attn_impl_name(impl), " is a CUDA kernel; the CPU backend runs eager attention (use --attn eager or --device cuda)");
  }
  std::string linear_path(const Weight& w, int64_t rows) const override {
    if (w.kind() == Weight::Kind::Quant4) {
      if (static_cast<const CpuQuant4&>(w).panels()) return cat("cpu bf16 ", quant_type_name(w.quant()), " matmul (avx512 bf16)");
      return cat("cpu fused dequant ", quant_type_name(w.quant()), " matmul");
    }
    return cat("cpu ", dtype_name(w.dtype()), " matmul");
  }

 private:
  // Where row t of a step is: its sequence (0 for a one-sequence step) and absolute position.
  struct RowAt {
    int seq = 0;
    int64_t pos = 0;
    int64_t end = 0;  // the position after the last row of the row's sequence in this step
  };
  // cache: the rows' positions index the KV cache (kv_write, attention; rope only needs positions).
  std::vector<RowAt> rows_of(int64_t T, const StepState& s, bool cache = true) const {
    std::vector<RowAt> at(static_cast<size_t>(T));
    if (!s.paged) {
      const int64_t pos0 = *s.pos0;
      if (cache) {
        NF4FLASH_CHECK(!paged_, "the KV cache is paged: a step must give its sequences (StepState::paged)");
        NF4FLASH_CHECK(pos0 + T <= kv_.capacity, "context length ", pos0 + T, " exceeds the KV cache capacity ",
                       kv_.capacity, " (raise --ctx-size)");
      }
      for (int64_t t = 0; t < T; ++t) at[size_t(t)] = {0, pos0 + t, pos0 + T};
      return at;
    }
    const PagedSeqs& p = *s.paged;
    NF4FLASH_CHECK(paged_, "a step over several sequences needs the paged KV cache (kv_allocate_paged)");
    NF4FLASH_CHECK(p.n_seqs >= 1 && p.row_start[0] == 0 && p.row_start[p.n_seqs] == T, "paged step: the ",
                   p.n_seqs, " sequences' rows do not cover the step's ", T, " rows");
    for (int i = 0; i < p.n_seqs; ++i) {
      NF4FLASH_CHECK(p.row_start[i] <= p.row_start[i + 1] && p.pos0[i] >= 0, "paged step: sequence ", i,
                     " has rows [", p.row_start[i], ", ", p.row_start[i + 1], ") at position ", p.pos0[i]);
      const int64_t end = p.pos0[i] + p.row_start[i + 1] - p.row_start[i];
      NF4FLASH_CHECK(end <= int64_t(p.max_blocks) * block_size_, "paged step: sequence ", i, " reaches position ", end,
                     " past its ", p.max_blocks, " blocks");
      for (int64_t t = p.row_start[i]; t < p.row_start[i + 1]; ++t) at[size_t(t)] = {i, p.pos0[i] + t - p.row_start[i], end};
    }
    return at;
  }
  // K or V of kv head g at (sequence, position) of the step's layout.
  float* kv_at(std::vector<float>& c, int layer, int g, const StepState& s, RowAt r) {
    return const_cast<float*>(std::as_const(*this).kv_at(c, layer, g, s, r));
  }
  const float* kv_at(const std::vector<float>& c, int layer, int g, const StepState& s, RowAt r) const {
    if (!paged_) return kv_ptr(c, layer, g, r.pos);
    const int32_t b = s.paged->block_tables[int64_t(r.seq) * s.paged->max_blocks + r.pos / block_size_];
    NF4FLASH_CHECK(b >= 0 && b < n_blocks_, "paged step: block ", b, " of sequence ", r.seq, " out of range (",
                   n_blocks_, " blocks)");
    return c.data() +
           (((static_cast<size_t>(layer) * n_blocks_ + b) * kv_.n_kv_heads + g) * block_size_ + r.pos % block_size_) *
               kv_.head_dim;
  }

  const CpuDense& dense(const Weight& w, const char* op) const {
    NF4FLASH_CHECK(w.kind() == Weight::Kind::Dense, op, ": expects a dense weight");
    return static_cast<const CpuDense&>(w);
  }
  float* kv_ptr(std::vector<float>& c, int layer, int g, int64_t pos) {
    return c.data() + ((static_cast<size_t>(layer) * kv_.n_kv_heads + g) * kv_.capacity + pos) * kv_.head_dim;
  }
  const float* kv_ptr(const std::vector<float>& c, int layer, int g, int64_t pos) const {
    return c.data() + ((static_cast<size_t>(layer) * kv_.n_kv_heads + g) * kv_.capacity + pos) * kv_.head_dim;
  }

  DType compute_;
  int32_t slots_[kSampleSlots] = {};
  KVCacheDesc kv_;
  std::vector<float> k_cache_, v_cache_;
  bool paged_ = false;  // kv_allocate_paged: blocks instead of one contiguous range per layer
  int64_t n_blocks_ = 0;
  int block_size_ = 0;
};

}  // namespace

std::string_view attn_impl_name(AttnImpl a) {
  switch (a) {
    case AttnImpl::Auto: return "auto";
    case AttnImpl::Flash: return "flash";
    case AttnImpl::Sdpa: return "sdpa";
    case AttnImpl::Eager: return "eager";
  }
  return "?";
}

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& o) { return std::make_unique<CpuBackend>(o); }

}  // namespace nf4flash
