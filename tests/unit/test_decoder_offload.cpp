// Layers offloaded to a second backend (Decoder with an OffloadSplit): two CPU backends, the split
// at every layer boundary (0: every layer on the second backend, n_layers: none), against the
// decoder on one backend, on every conformance model: the logits of a prompt in two chunks and of
// decode steps through both backends' KV caches, and of a batched step over paged caches, bit for
// bit (each layer runs the same kernels on the same rows wherever it runs); 4-bit weights too; the
// weights' bytes counted per backend; refusals.
#include <gtest/gtest.h>

#include <cstring>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "model/decoder.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

WeightPolicy f32_policy() { return WeightPolicy{}; }

// A decoder on backend `a`, its layers from `split` on backend `b` (split < 0: no second backend).
class OffloadModel {
 public:
  static constexpr int64_t kCtx = 256, kMaxRows = 256;

  OffloadModel(const std::string& model, int split, const WeightPolicy& wp) {
    const std::string dir = model_dir(model);
    cfg_ = load_model_config(dir);
    store_ = WeightStore::open_dir(dir);
    a_ = make_cpu_backend({DType::F32, 1});
    b_ = make_cpu_backend({DType::F32, 1});
    OffloadSplit off;
    if (split >= 0) off = {b_.get(), split};
    dec_ = std::make_unique<Decoder>(cfg_, resolve_arch(cfg_), *a_, *store_, wp, kMaxRows, nullptr, TpShard{}, off);
    dec_->kv_allocate({cfg_.n_layers, cfg_.n_kv_heads, cfg_.head_dim, kCtx, DType::F32});
    ids_ = a_->alloc(size_t(kMaxRows) * 4);
    pos_ = a_->alloc(4);
    logits_ = a_->alloc(size_t(kMaxRows * cfg_.vocab_size) * 4);
  }

  const ModelConfig& config() const { return cfg_; }
  const Decoder& decoder() const { return *dec_; }

  // The logits of every row of a forward of `toks` at pos0.
  std::vector<float> forward(const std::vector<int32_t>& toks, int64_t pos0) {
    const int64_t T = int64_t(toks.size()), V = cfg_.vocab_size;
    a_->upload(ids_->data(), toks.data(), toks.size() * 4);
    const int32_t p = int32_t(pos0);
    a_->upload(pos_->data(), &p, 4);
    StepState st;
    st.pos0 = static_cast<int32_t*>(pos_->data());
    st.pos0_host = pos0;
    const Act lg{logits_->data(), DType::F32, T, V};
    dec_->forward(static_cast<const int32_t*>(ids_->data()), T, st, lg, T);
    std::vector<float> out(size_t(T * V));
    a_->download(out.data(), lg.data, lg.bytes());
    return out;
  }

  void use_paged(int64_t n_blocks, int block_size) {
    dec_->kv_allocate_paged({cfg_.n_layers, cfg_.n_kv_heads, cfg_.head_dim, kCtx, DType::F32}, n_blocks, block_size);
  }

  // One step of several sequences over the paged caches: the logits of each sequence's last row.
  std::vector<float> forward_paged(const PagedStepRows& r, const std::vector<int32_t>& tables, int max_blocks) {
    auto put = [&](const std::vector<int32_t>& v) {
      auto b = a_->alloc(std::max<size_t>(v.size(), 1) * 4);
      a_->upload(b->data(), v.data(), v.size() * 4);
      return b;
    };
    auto idb = put(r.ids), rsb = put(r.row_start), p0b = put(r.pos0), tb = put(tables), lrb = put(r.logit_rows);
    PagedSeqs ps;
    ps.n_seqs = int(r.pos0.size());
    ps.row_start = static_cast<const int32_t*>(rsb->data());
    ps.pos0 = static_cast<const int32_t*>(p0b->data());
    ps.block_tables = static_cast<const int32_t*>(tb->data());
    ps.max_blocks = max_blocks;
    ps.row_start_host = r.row_start.data();
    ps.pos0_host = r.pos0.data();
    StepState st;
    st.paged = &ps;
    const int64_t n = int64_t(r.logit_rows.size()), V = cfg_.vocab_size;
    const Act lg{logits_->data(), DType::F32, n, V};
    dec_->forward(static_cast<const int32_t*>(idb->data()), int64_t(r.ids.size()), st, lg, n,
                  static_cast<const int32_t*>(lrb->data()));
    std::vector<float> out(size_t(n * V));
    a_->download(out.data(), lg.data, lg.bytes());
    return out;
  }

 private:
  ModelConfig cfg_;
  std::unique_ptr<WeightStore> store_;
  std::unique_ptr<Backend> a_, b_;
  std::unique_ptr<Decoder> dec_;
  std::unique_ptr<Buffer> ids_, pos_, logits_;
};

void expect_same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0)
      << what << ": differs by up to " << max_abs_diff(got, want);
}

// A prompt in two chunks (the second continuing the first's cache), then three decode steps.
std::vector<std::vector<float>> run(OffloadModel& m, const Golden& g) {
  const auto toks = g.i32("tokens_2");
  std::vector<std::vector<float>> out;
  out.push_back(m.forward(std::vector<int32_t>(toks.begin(), toks.begin() + 120), 0));
  out.push_back(m.forward(std::vector<int32_t>(toks.begin() + 120, toks.end()), 120));
  for (int k = 0; k < 3; ++k) out.push_back(m.forward({toks[size_t(k)]}, int64_t(toks.size()) + k));
  return out;
}

class DecoderOffload : public ::testing::TestWithParam<const char*> {};

TEST_P(DecoderOffload, EverySplitEqualsOneBackend) {
  const std::string model = GetParam();
  const Golden g(model);
  OffloadModel one(model, -1, f32_policy());
  const auto want = run(one, g);
  EXPECT_EQ(one.decoder().stats().offloaded_bytes, 0u);
  const int L = one.config().n_layers;
  for (int split = 0; split <= L; ++split) {
    OffloadModel part(model, split, f32_policy());
    EXPECT_EQ(part.decoder().offload_first_layer(), split);
    EXPECT_EQ(part.decoder().stats().weight_bytes, one.decoder().stats().weight_bytes);
    if (split < L) EXPECT_GT(part.decoder().stats().offloaded_bytes, 0u) << "split " << split;
    else EXPECT_EQ(part.decoder().stats().offloaded_bytes, 0u);
    const auto got = run(part, g);
    for (size_t k = 0; k < got.size(); ++k) expect_same(got[k], want[k], cat(model, " split ", split, " forward ", k));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DecoderOffload, ::testing::ValuesIn(kConformanceModels), [](const auto& info) {
  std::string s = info.param;
  for (auto& ch : s)
    if (ch == '-' || ch == '.') ch = '_';
  return s;
});

// A batched step over the paged caches of both backends (three sequences: prompt chunks, then
// their continuations) equals the same steps on one backend.
TEST(DecoderOffloadPaged, BatchedStepsEqualOneBackend) {
  for (const char* model : {"llama-gqa-hd64", "gemma3-qknorm-window", "qwen3moe-topk"}) {
    OffloadModel one(model, -1, f32_policy()), part(model, 1, f32_policy());
    const int64_t V = one.config().vocab_size;
    std::vector<std::vector<int32_t>> seqs(3);
    const int64_t lens[3] = {9, 12, 14}, cut[3] = {5, 9, 1}, zero[3] = {0, 0, 0};
    for (int i = 0; i < 3; ++i)
      for (int64_t p = 0; p < lens[i]; ++p) seqs[size_t(i)].push_back(int32_t((7 + 31 * p + 101 * i) % (V - 1) + 1));
    const int bs = 4, max_blocks = 4;
    std::vector<int32_t> tables(3 * max_blocks);
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < max_blocks; ++k) tables[size_t(i * max_blocks + k)] = 3 * k + i;
    one.use_paged(12, bs);
    part.use_paged(12, bs);
    for (int step = 0; step < 2; ++step) {
      const PagedStepRows r = paged_step_rows(seqs, step == 0 ? zero : cut, step == 0 ? cut : lens);
      expect_same(part.forward_paged(r, tables, max_blocks), one.forward_paged(r, tables, max_blocks),
                  cat(model, " paged step ", step));
    }
  }
}

// 4-bit weights quantized on load (NF4 with double quant, FP4) on both backends.
TEST(DecoderOffloadQuant4, EqualsOneBackend) {
  for (const char* model : {"llama-rope-yarn", "mixtral-moe", "phi3-longrope-hd96"}) {
    for (QuantType qt : {QuantType::NF4, QuantType::FP4}) {
      WeightPolicy wp;
      wp.quant = qt;
      wp.double_quant = qt == QuantType::NF4;
      const Golden g(model);
      OffloadModel one(model, -1, wp), part(model, 1, wp);
      EXPECT_GT(part.decoder().stats().n_quant4, 0);
      const auto want = run(one, g), got = run(part, g);
      for (size_t k = 0; k < got.size(); ++k)
        expect_same(got[k], want[k], cat(model, " ", quant_type_name(qt), " forward ", k));
    }
  }
}

TEST(DecoderOffloadErrors, OutOfRangeSplitAndSameBackend) {
  const std::string dir = model_dir("llama-gqa-hd64");
  const ModelConfig cfg = load_model_config(dir);
  auto store = WeightStore::open_dir(dir);
  auto a = make_cpu_backend({DType::F32, 1}), b = make_cpu_backend({DType::F32, 1});
  auto load = [&](const OffloadSplit& off) {
    Decoder d(cfg, resolve_arch(cfg), *a, *store, f32_policy(), 64, nullptr, TpShard{}, off);
  };
  auto expect_error = [&](const OffloadSplit& off, const std::string& needle) {
    try {
      load(off);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({b.get(), -1}, "out of range");
  expect_error({a.get(), 0}, "the primary backend");
  EXPECT_NO_THROW(load({b.get(), cfg.n_layers}));  // nothing offloaded
}

}  // namespace
