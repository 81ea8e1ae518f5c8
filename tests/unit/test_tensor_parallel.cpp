// Tensor parallel over CPU backends: the decoder sharded over 2 and 4 ranks (threads of this
// process, an in-process communicator, one CPU thread per rank) against the unsharded decoder on
// every conformance model, f32 compute, over the golden token sequences: logits within f32
// rounding, every rank's logits identical, and the same greedy continuation (transformers' too).
// 4-bit (quantize-on-load nf4/fp4, double quant or not) where the shards fall on block
// boundaries; refusals where they do not; each rank's KV cache holding only its kv heads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "io/bnb_writer.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "model/decoder.h"
#include <nlohmann/json.hpp>
#include <random>

#include "parallel/communicator.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {



// One decoder per rank, each on its own CPU backend (1 thread), driven together.
class TpModel {
 public:
  static constexpr int64_t kCtx = 256, kMaxRows = 256;

  // `model`: a fixture's name, or a folder's path
  // `threads`: each rank's CPU backend threads (one pool that the ranks share); `compute`: F32, or
  // BF16 (bf16 weights, 4-bit ones repacked into bf16 panels; f32 math)
  TpModel(const std::string& model, int world, const WeightPolicy& wp, int threads = 1, DType compute = DType::F32)
      : world_(world), ranks_(size_t(world)) {
    const std::string dir = model.find('/') == std::string::npos ? model_dir(model) : model;
    cfg_ = load_model_config(dir);
    arch_ = resolve_arch(cfg_);
    store_ = WeightStore::open_dir(dir);
    if (world > 1) group_ = std::make_unique<InProcessGroup>(world);
    for (Rank& k : ranks_) k.be = make_cpu_backend({compute, threads});  // here: the pool is sized before the threads
    on_ranks([&](int r) {
      Rank& k = ranks_[size_t(r)];
      const TpShard s{r, world, group_ ? &group_->comm(r) : nullptr};
      k.dec = std::make_unique<Decoder>(cfg_, arch_, *k.be, *store_, wp, kMaxRows, nullptr, s);
      k.be->kv_allocate({cfg_.n_layers, k.dec->kv_heads(), cfg_.head_dim, kCtx, DType::F32});
      k.ids = k.be->alloc(size_t(kMaxRows) * 4);
      k.pos = k.be->alloc(4);
      k.logits = k.be->alloc(size_t(kMaxRows * cfg_.vocab_size) * 4);
      k.st.pos0 = static_cast<int32_t*>(k.pos->data());
    });
  }

  const ModelConfig& config() const { return cfg_; }
  const Decoder& decoder(int r) const { return *ranks_[size_t(r)].dec; }
  const Backend& backend(int r) const { return *ranks_[size_t(r)].be; }

  // The logits [n_logits, vocab] of the last n_logits rows of a forward of `toks` at pos0, from
  // rank 0; every rank must hold the same bits.
  std::vector<float> forward(const std::vector<int32_t>& toks, int64_t pos0, int64_t n_logits) {
    const int64_t T = int64_t(toks.size()), V = cfg_.vocab_size;
    on_ranks([&](int r) {
      Rank& k = ranks_[size_t(r)];
      k.be->upload(k.ids->data(), toks.data(), toks.size() * 4);
      const int32_t p = int32_t(pos0);
      k.be->upload(k.pos->data(), &p, 4);
      k.st.pos0_host = pos0;
      const Act lg{k.logits->data(), DType::F32, n_logits, V};
      k.dec->forward(static_cast<const int32_t*>(k.ids->data()), T, k.st, lg, n_logits);
      k.out.resize(size_t(n_logits * V));
      k.be->download(k.out.data(), lg.data, lg.bytes());
    });
    for (int r = 1; r < world_; ++r)
      EXPECT_EQ(std::memcmp(ranks_[size_t(r)].out.data(), ranks_[0].out.data(), ranks_[0].out.size() * 4), 0)
          << "rank " << r << "'s logits differ from rank 0's";
    return ranks_[0].out;
  }

  // The paged KV cache instead of the contiguous one, on every rank (its kv heads).
  void use_paged(int64_t n_blocks, int block_size) {
    on_ranks([&](int r) {
      Rank& k = ranks_[size_t(r)];
      k.be->kv_allocate_paged({cfg_.n_layers, k.dec->kv_heads(), cfg_.head_dim, 0, DType::F32}, n_blocks, block_size);
    });
  }

  // One step over several sequences of the paged cache (see PagedSeqs): the logits of the rows
  // `logit_rows` names, from rank 0 (every rank's the same).
  std::vector<float> forward_paged(const std::vector<int32_t>& ids, const std::vector<int32_t>& row_start,
                                   const std::vector<int32_t>& pos0, const std::vector<int32_t>& tables,
                                   int max_blocks, const std::vector<int32_t>& logit_rows) {
    const int64_t n = int64_t(logit_rows.size()), V = cfg_.vocab_size;
    on_ranks([&](int r) {
      Rank& k = ranks_[size_t(r)];
      auto put = [&](const std::vector<int32_t>& v) {
        auto b = k.be->alloc(std::max<size_t>(v.size(), 1) * 4);
        k.be->upload(b->data(), v.data(), v.size() * 4);
        return b;
      };
      auto idb = put(ids), rsb = put(row_start), p0b = put(pos0), tb = put(tables), lrb = put(logit_rows);
      PagedSeqs ps;
      ps.n_seqs = int(pos0.size());
      ps.row_start = static_cast<const int32_t*>(rsb->data());
      ps.pos0 = static_cast<const int32_t*>(p0b->data());
      ps.block_tables = static_cast<const int32_t*>(tb->data());
      ps.max_blocks = max_blocks;
      ps.row_start_host = row_start.data();
      ps.pos0_host = pos0.data();
      StepState st;
      st.paged = &ps;
      const Act lg{k.logits->data(), DType::F32, n, V};
      k.dec->forward(static_cast<const int32_t*>(idb->data()), int64_t(ids.size()), st, lg, n,
                     static_cast<const int32_t*>(lrb->data()));
      k.out.resize(size_t(n * V));
      k.be->download(k.out.data(), lg.data, lg.bytes());
    });
    for (int r = 1; r < world_; ++r) EXPECT_EQ(ranks_[size_t(r)].out, ranks_[0].out) << "rank " << r;
    return ranks_[0].out;
  }

  // Greedy continuation: the prompt in one forward, then one token per step from the KV cache.
  std::vector<int32_t> greedy(const std::vector<int32_t>& prompt, int n_new, std::vector<float>* step_logits) {
    std::vector<int32_t> out;
    std::vector<float> lg = forward(prompt, 0, 1);
    for (int i = 0; i < n_new; ++i) {
      step_logits->insert(step_logits->end(), lg.begin(), lg.end());
      out.push_back(int32_t(std::max_element(lg.begin(), lg.end()) - lg.begin()));
      if (i + 1 < n_new) lg = forward({out.back()}, int64_t(prompt.size()) + i, 1);
    }
    return out;
  }

 private:
  struct Rank {
    std::unique_ptr<Backend> be;
    std::unique_ptr<Decoder> dec;  // after be: destroyed first
    std::unique_ptr<Buffer> ids, pos, logits;
    StepState st;
    std::vector<float> out;
  };

  // fn(rank) on one thread per rank (inline unsharded); rethrows the first failure (a failing
  // rank aborts the group, so the others cannot wait for it forever).
  void on_ranks(const std::function<void(int)>& fn) {
    if (world_ == 1) return fn(0);
    std::mutex mu;
    std::exception_ptr first;
    std::vector<std::thread> ts;
    for (int r = 0; r < world_; ++r)
      ts.emplace_back([&, r] {
        try {
          fn(r);
        } catch (...) {
          {
            std::lock_guard<std::mutex> lk(mu);
            if (!first) first = std::current_exception();
          }
          group_->comm(r).abort();
        }
      });
    for (auto& t : ts) t.join();
    if (first) std::rethrow_exception(first);
  }

  int world_;
  ModelConfig cfg_;
  ArchFlags arch_;
  std::unique_ptr<WeightStore> store_;
  std::unique_ptr<InProcessGroup> group_;
  std::vector<Rank> ranks_;
};

WeightPolicy f32_policy() {
  WeightPolicy p;
  p.dense_store = DType::F32;
  return p;
}

WeightPolicy quant_policy(QuantType t, bool dq) {
  WeightPolicy p = f32_policy();
  p.quant = t;
  p.double_quant = dq;
  return p;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(double(x)));
  return m;
}

// Sharding changes only the order of f32 additions: a rank sums its share of each o_proj/down
// dot product, and the ranks' partial sums are added in rank order. Through these 2-3 layer
// models that moves the logits by at most 5e-7 of the largest logit (a few f32 ulps; the tests
// print each distance), so the bound is 1e-5 of it, 20 times that. A missing reduction, a bias
// added twice or a q head reading the wrong kv head moves them by a large fraction of the scale.
constexpr double kTol = 1e-5;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double d = max_abs_diff(got, want), scale = std::max(1.0, max_abs(want));
  EXPECT_LE(d, kTol * scale) << what << ": max |diff| " << d << " at logit scale " << scale;
  std::printf("[tp] %s: max |diff| / logit scale %.3g\n", what.c_str(), d / scale);
}

class TensorParallel : public ::testing::TestWithParam<const char*> {};

// TP=2 and TP=4 equal TP=1 on the three golden sequences (every row's logits) and on the greedy
// continuation of sequence 1 through the KV cache, which TP=1 must also take from transformers.
TEST_P(TensorParallel, F32ShardsMatchUnsharded) {
  const std::string name = GetParam();
  Golden g(name);
  TpModel one(name, 1, f32_policy());
  std::vector<std::vector<float>> ref;
  for (int i = 0; i < 3; ++i) {
    const auto toks = g.i32(cat("tokens_", i));
    ref.push_back(one.forward(toks, 0, int64_t(toks.size())));
    // the harness computes the model: the unsharded logits are transformers' (rows the golden keeps)
    const auto lg_ref = g.f32(cat("logits_f32_", i));
    const size_t V = size_t(one.config().vocab_size);
    const std::vector<float> kept(ref.back().end() - std::ptrdiff_t(lg_ref.size()), ref.back().end());
    EXPECT_EQ(lg_ref.size() % V, 0u);
    EXPECT_LT(rel_l2(kept, lg_ref), 1e-4) << name << " seq " << i << " unsharded vs transformers";
  }
  const auto prompt = g.i32("tokens_1"), want = g.i32("greedy_f32_from_1");
  std::vector<float> ref_steps;
  EXPECT_EQ(one.greedy(prompt, int(want.size()), &ref_steps), want) << name << " unsharded";
  for (int world : {2, 4}) {
    TpModel tp(name, world, f32_policy());
    for (int i = 0; i < 3; ++i)
      expect_close(tp.forward(g.i32(cat("tokens_", i)), 0, int64_t(g.i32(cat("tokens_", i)).size())), ref[size_t(i)],
                   cat(name, " tp", world, " seq", i));
    std::vector<float> steps;
    EXPECT_EQ(tp.greedy(prompt, int(want.size()), &steps), want) << name << " tp" << world;
    expect_close(steps, ref_steps, cat(name, " tp", world, " decode"));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallel, ::testing::ValuesIn(kConformanceModels), [](const auto& info) {
  std::string s = info.param;
  for (auto& c : s) if (c == '-') c = '_';
  return s;
});

// 4-bit, quantized on load: every rank quantizes the whole tensor as the unsharded decoder does and
// keeps its cut, so the weights are the same values and only the additions' order differs. The
// models whose q-head, intermediate and expert ranges fall on 64-element blocks at TP=2.
struct QuantCase {
  const char* model;
  QuantType type;
  bool double_quant;
};

void PrintTo(const QuantCase& c, std::ostream* os) {
  *os << c.model << " " << quant_type_name(c.type) << (c.double_quant ? " double quant" : "");
}

class TensorParallelQuant : public ::testing::TestWithParam<QuantCase> {};

TEST_P(TensorParallelQuant, Tp2MatchesUnsharded) {
  const QuantCase c = GetParam();
  Golden g(c.model);
  const WeightPolicy wp = quant_policy(c.type, c.double_quant);
  TpModel one(c.model, 1, wp), two(c.model, 2, wp);
  EXPECT_GT(two.decoder(0).stats().n_quant4, 0);
  EXPECT_EQ(two.decoder(0).stats().n_quant4, one.decoder(0).stats().n_quant4);
  for (int i = 0; i < 3; ++i) {
    const auto toks = g.i32(cat("tokens_", i));
    expect_close(two.forward(toks, 0, int64_t(toks.size())), one.forward(toks, 0, int64_t(toks.size())),
                 cat(c.model, " ", quant_type_name(c.type), c.double_quant ? "-dq" : "", " tp2 seq", i));
  }
  const auto prompt = g.i32("tokens_1");
  std::vector<float> s1, s2;
  EXPECT_EQ(two.greedy(prompt, 12, &s2), one.greedy(prompt, 12, &s1)) << c.model;
}

const QuantCase kQuantCases[] = {
    {"llama-rope-yarn", QuantType::NF4, false},      {"llama-rope-yarn", QuantType::NF4, true},
    {"llama-rope-dynamic", QuantType::FP4, false},   {"mixtral-moe", QuantType::NF4, true},
    {"mixtral-moe", QuantType::FP4, false},          {"gemma2-hd256-softcap", QuantType::NF4, true},
    {"gemma3-qknorm-window", QuantType::NF4, false}, {"gemma3-qknorm-window", QuantType::NF4, true},
};

INSTANTIATE_TEST_SUITE_P(Models, TensorParallelQuant, ::testing::ValuesIn(kQuantCases), [](const auto& info) {
  std::string s = cat(info.param.model, "_", quant_type_name(info.param.type), info.param.double_quant ? "_dq" : "");
  for (auto& ch : s) if (ch == '-') ch = '_';
  return s;
});

// gemma3 at TP=4: 64-column cuts of o_proj (one head of 64) and of down (256 / 4): still blocks.
TEST(TensorParallelQuant4, Gemma3Tp4MatchesUnsharded) {
  Golden g("gemma3-qknorm-window");
  const WeightPolicy wp = quant_policy(QuantType::NF4, true);
  TpModel one("gemma3-qknorm-window", 1, wp), four("gemma3-qknorm-window", 4, wp);
  const auto toks = g.i32("tokens_2");
  expect_close(four.forward(toks, 0, int64_t(toks.size())), one.forward(toks, 0, int64_t(toks.size())),
               "gemma3 nf4-dq tp4");
}

// A pre-quantized checkpoint (written as bitsandbytes writes it, nf4 with double quant) cut on its
// blocks: TP=2 equals TP=1 of the checkpoint, and equals TP=2 quantizing the plain model on load
// bit for bit (the same quantized values, the same products).
TEST(TensorParallelQuant4, PrequantizedCheckpointTp2) {
  TempDir tmp("nf4flash_tp_bnb");
  QuantizeCheckpointOptions o;
  o.model_dir = model_dir("llama-rope-yarn");
  o.out_dir = tmp / "bnb";
  o.double_quant = true;
  quantize_checkpoint(o);
  WeightPolicy pre = quant_policy(QuantType::NF4, true);
  pre.prequantized = true;
  const auto toks = Golden("llama-rope-yarn").i32("tokens_2");
  const int64_t T = int64_t(toks.size());
  TpModel one(o.out_dir, 1, pre), two(o.out_dir, 2, pre);
  EXPECT_GT(two.decoder(0).stats().n_quant4, 0);
  const std::vector<float> lg2 = two.forward(toks, 0, T);
  expect_close(lg2, one.forward(toks, 0, T), "llama-rope-yarn bnb-nf4-dq tp2");
  TpModel on_load("llama-rope-yarn", 2, quant_policy(QuantType::NF4, true));
  EXPECT_EQ(max_abs_diff(on_load.forward(toks, 0, T), lg2), 0.0);
}

// 4-bit MLPs split in whole blocks: intermediate 704 (11 blocks of 64) over 2 ranks is 320 + 384
// columns of down_proj, quantized on load and pre-quantized alike. Where the blocksize does not
// divide the intermediate (128: 5.5 blocks) the cut falls inside a block and is refused with the
// tensor named.
TEST(TensorParallelQuant4, ShardsFallOnBlocks) {
  for (const char* model : {"llama-gqa-hd64", "llama-gqa-hd64-bnb-nf4"}) {
    WeightPolicy wp = quant_policy(QuantType::NF4, false);
    if (std::string(model).find("bnb") != std::string::npos) {
      wp.quant = QuantType::None;
      wp.prequantized = true;
    }
    TpModel two(model, 2, wp);
    EXPECT_EQ(two.decoder(0).tp_layout().inter.n, 320) << model;
    EXPECT_EQ(two.decoder(1).tp_layout().inter.n, 384) << model;
    const std::vector<int32_t> toks = {1, 5, 9, 14, 3};
    TpModel one(model, 1, wp);
    expect_close(two.forward(toks, 0, 5), one.forward(toks, 0, 5), cat(model, " nf4 tp2 in whole blocks"));
  }
  WeightPolicy wp = quant_policy(QuantType::NF4, false);
  wp.blocksize = 128;
  try {
    TpModel two("llama-gqa-hd64", 2, wp);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("tensor model.layers.0.mlp.down_proj.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("do not start and end on a block"), std::string::npos) << m;
  }
  // the same model unquantized shards anywhere
  EXPECT_NO_THROW(TpModel("llama-gqa-hd64", 2, f32_policy()));
}

// The o_proj and down biases are added once (by the last rank), the q/k/v and gate/up biases
// split with their rows: llama-rope-yarn with attention_bias and mlp_bias on and random biases
// (no fixture has o_proj or MLP biases).
TEST(TensorParallelBias, EveryBiasCountedOnce) {
  TempDir tmp("nf4flash_tp_bias");
  const std::string src = model_dir("llama-rope-yarn");
  nlohmann::json cfg = nlohmann::json::parse(slurp(src + "/config.json"));
  cfg["attention_bias"] = true;
  cfg["mlp_bias"] = true;
  tmp.file("config.json", cfg.dump());
  auto store = WeightStore::open_dir(src);
  std::vector<TensorToWrite> ts;
  for (const std::string& n : store->names()) {
    const TensorInfo& t = store->get(n);
    ts.push_back({n, t.dtype, t.shape, t.data, t.nbytes});
  }
  const int64_t H = cfg["hidden_size"], I = cfg["intermediate_size"], hd = cfg["head_dim"];
  const int64_t nh = cfg["num_attention_heads"], nkv = cfg["num_key_value_heads"];
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<std::vector<float>> biases;
  biases.reserve(32);
  for (int l = 0; l < int(cfg["num_hidden_layers"]); ++l) {
    const std::pair<const char*, int64_t> bs[] = {{"self_attn.q_proj", nh * hd}, {"self_attn.k_proj", nkv * hd},
                                                  {"self_attn.v_proj", nkv * hd}, {"self_attn.o_proj", H},
                                                  {"mlp.gate_proj", I}, {"mlp.up_proj", I}, {"mlp.down_proj", H}};
    for (const auto& [name, n] : bs) {
      biases.emplace_back(size_t(n));
      for (float& x : biases.back()) x = nd(rng);
      ts.push_back({cat("model.layers.", l, ".", name, ".bias"), DType::F32, {n}, biases.back().data(), size_t(n) * 4});
    }
  }
  write_safetensors(tmp / "model.safetensors", ts);
  TpModel one(tmp.path.string(), 1, f32_policy());
  const std::vector<int32_t> toks = Golden("llama-rope-yarn").i32("tokens_1");
  const std::vector<float> ref = one.forward(toks, 0, int64_t(toks.size()));
  // the biases change the model (the comparison below could not pass by leaving them out)
  TpModel plain("llama-rope-yarn", 1, f32_policy());
  EXPECT_GT(max_abs_diff(plain.forward(toks, 0, int64_t(toks.size())), ref), 0.1);
  for (int world : {2, 4}) {
    TpModel tp(tmp.path.string(), world, f32_policy());
    expect_close(tp.forward(toks, 0, int64_t(toks.size())), ref, cat("llama-rope-yarn+biases tp", world));
  }
}

// A batched step over the paged KV cache (the batch runner's path): three sequences with their
// blocks interleaved over the pool, prefill chunks and single tokens in one step, logits of each
// sequence's last row; at TP=2 and TP=4 equal to each sequence's own unsharded forward. phi3 (2 q
// heads): at TP=4 two ranks hold no heads.
TEST(TensorParallelPaged, BatchedStepMatchesUnshardedSolo) {
  for (const std::string model : {"llama-gqa-hd64", "phi3-longrope-hd96"}) {
    TpModel one(model, 1, f32_policy());
    const int64_t V = one.config().vocab_size;
    std::vector<std::vector<int32_t>> seqs(3);
    const int64_t lens[3] = {9, 12, 14}, cut[3] = {5, 9, 1};
    for (int i = 0; i < 3; ++i)
      for (int64_t p = 0; p < lens[i]; ++p) seqs[size_t(i)].push_back(int32_t((7 + 31 * p + 101 * i) % (V - 1) + 1));
    std::vector<std::vector<float>> solo;  // per sequence: the logits of every position
    for (const auto& q : seqs) solo.push_back(one.forward(q, 0, int64_t(q.size())));
    const int bs = 4, max_blocks = 4;
    std::vector<int32_t> tables(3 * max_blocks);
    for (int i = 0; i < 3; ++i)
      for (int k = 0; k < max_blocks; ++k) tables[size_t(i * max_blocks + k)] = 3 * k + i;
    for (int world : {2, 4}) {
      TpModel tp(model, world, f32_policy());
      tp.use_paged(12, bs);
      const int64_t zero[3] = {0, 0, 0};
      for (int step = 0; step < 2; ++step) {
        const PagedStepRows r = paged_step_rows(seqs, step == 0 ? zero : cut, step == 0 ? cut : lens);
        const std::vector<float> got = tp.forward_paged(r.ids, r.row_start, r.pos0, tables, max_blocks, r.logit_rows);
        for (int i = 0; i < 3; ++i) {
          const int64_t p = (step == 0 ? cut[i] : lens[i]) - 1;
          expect_close(std::vector<float>(got.begin() + i * V, got.begin() + (i + 1) * V),
                       std::vector<float>(solo[size_t(i)].begin() + p * V, solo[size_t(i)].begin() + (p + 1) * V),
                       cat(model, " paged tp", world, " step", step, " seq", i));
        }
      }
    }
  }
}

// Compute bf16 (the CPU default): dense weights held in bf16 and 4-bit weights in bf16 panels, cut
// the same way; TP=2 equals TP=1 of the same compute dtype.
TEST(TensorParallelBf16, Tp2MatchesUnsharded) {
  const auto toks = Golden("gemma3-qknorm-window").i32("tokens_2");
  const int64_t T = int64_t(toks.size());
  WeightPolicy dense = f32_policy(), nf4 = quant_policy(QuantType::NF4, true);
  dense.dense_store = nf4.dense_store = DType::BF16;
  for (const WeightPolicy& wp : {dense, nf4}) {
    TpModel one("gemma3-qknorm-window", 1, wp, 1, DType::BF16), two("gemma3-qknorm-window", 2, wp, 1, DType::BF16);
    expect_close(two.forward(toks, 0, T), one.forward(toks, 0, T),
                 cat("gemma3 bf16 ", quant_type_name(wp.quant), " tp2"));
  }
}

// Ranks sharing one pool of 2 threads (a rank's products run on the pool or, while another rank's
// job is out, on the rank's own thread) compute what ranks of 1 thread compute.
TEST(TensorParallelThreads, RanksSharingAPool) {
  const auto toks = Golden("qwen2-bias").i32("tokens_2");
  const int64_t T = int64_t(toks.size());
  std::vector<float> ref;
  {
    TpModel solo("qwen2-bias", 2, f32_policy(), 1);
    ref = solo.forward(toks, 0, T);
  }
  TpModel shared("qwen2-bias", 2, f32_policy(), 2);
  for (int i = 0; i < 3; ++i) expect_close(shared.forward(toks, 0, T), ref, "qwen2-bias tp2, 2 threads");
}

// Each rank's KV cache holds its kv heads only: llama-gqa-hd64 has 2 kv heads; at TP=2 one per
// rank, at TP=4 one per rank too (each read by two ranks' q heads, so held twice).
TEST(TensorParallelKv, EachRankHoldsItsKvHeads) {
  TpModel one("llama-gqa-hd64", 1, f32_policy()), two("llama-gqa-hd64", 2, f32_policy()),
      four("llama-gqa-hd64", 4, f32_policy());
  EXPECT_EQ(one.decoder(0).kv_heads(), 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(two.decoder(r).kv_heads(), 1);
    EXPECT_EQ(two.decoder(r).tp_layout().kv_heads.begin, r);
    EXPECT_EQ(two.backend(r).kv_bytes() * 2, one.backend(0).kv_bytes());
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(four.decoder(r).kv_heads(), 1);
    EXPECT_EQ(four.decoder(r).tp_layout().kv_heads.begin, r / 2);
    EXPECT_EQ(four.decoder(r).tp_layout().q_heads.n, 1);
  }
  // and the weights split: a rank holds about half of the linear weights (embedding replicated)
  EXPECT_LT(two.decoder(0).stats().weight_bytes, one.decoder(0).stats().weight_bytes * 3 / 4);
}

}  // namespace
