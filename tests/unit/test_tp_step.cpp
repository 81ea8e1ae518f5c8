// The tensor-parallel step protocol (parallel/tp_step.h) over CPU backends in threads:
//  - a step's encoding round-trips, and malformed messages (truncated, trailing bytes, a foreign
//    marker, sizes that disagree) are one clear error;
//  - broadcast_bytes carries rank 0's bytes, of changing sizes, to every rank;
//  - rank 0 alone decides a greedy continuation (prompt, then one token a step from its own
//    logits) and a step of two sequences over the paged cache, while ranks 1..N-1 only run
//    tp_follow: rank 0's logits equal the unsharded decoder's within f32 rounding, and every
//    follower ran every forward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/arch.h"
#include "model/decoder.h"
#include "parallel/tp_step.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

TpStep paged_step() {
  TpStep s;
  s.ids = {5, 6, 7, 8, 9};
  s.row_start = {0, 3, 5};
  s.seq_pos0 = {0, 4};
  s.block_tables = {0, 1, 2, 3};
  s.max_blocks = 2;
  s.n_logits = 2;
  s.logit_rows = {2, 4};
  return s;
}

TEST(TpStep, EncodingRoundTrips) {
  const TpStep s = paged_step();
  const TpStep d = decode_step(encode_step(s));
  EXPECT_EQ(d.op, TpOp::Forward);
  EXPECT_EQ(d.ids, s.ids);
  EXPECT_EQ(d.row_start, s.row_start);
  EXPECT_EQ(d.seq_pos0, s.seq_pos0);
  EXPECT_EQ(d.block_tables, s.block_tables);
  EXPECT_EQ(d.max_blocks, s.max_blocks);
  EXPECT_EQ(d.n_logits, s.n_logits);
  EXPECT_EQ(d.logit_rows, s.logit_rows);
  TpStep c;
  c.ids = {1, 2, 3};
  c.pos0 = 17;
  const TpStep dc = decode_step(encode_step(c));
  EXPECT_EQ(dc.pos0, 17);
  EXPECT_TRUE(dc.row_start.empty());
  TpStep stop;
  stop.op = TpOp::Stop;
  EXPECT_EQ(decode_step(encode_step(stop)).op, TpOp::Stop);
  TpStep kv;
  kv.op = TpOp::KvCache;
  kv.kv_capacity = int64_t(3) << 33;  // past 32 bits
  kv.kv_blocks = 1000;
  kv.kv_block_size = 16;
  kv.kv_dtype = DType::BF16;
  const TpStep k2 = decode_step(encode_step(kv));
  EXPECT_EQ(k2.op, TpOp::KvCache);
  EXPECT_EQ(k2.kv_capacity, kv.kv_capacity);
  EXPECT_EQ(k2.kv_blocks, 1000);
  EXPECT_EQ(k2.kv_block_size, 16);
  EXPECT_EQ(k2.kv_dtype, DType::BF16);
}

TEST(TpStep, MalformedMessagesAreOneClearError) {
  const std::vector<uint8_t> good = encode_step(paged_step());
  auto error_of = [](const std::vector<uint8_t>& b) { return error_message([&] { decode_step(b); }); };
  std::vector<uint8_t> cut(good.begin(), good.end() - 3);
  EXPECT_NE(error_of(cut).find("tensor parallel step"), std::string::npos) << error_of(cut);
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  EXPECT_NE(error_of(longer).find("after its last field"), std::string::npos) << error_of(longer);
  std::vector<uint8_t> foreign = good;
  foreign[0] ^= 0xff;
  EXPECT_NE(error_of(foreign).find("step marker"), std::string::npos) << error_of(foreign);
  TpStep rows = paged_step();
  rows.row_start = {0, 3, 4};  // does not end at the step's 5 rows
  EXPECT_NE(error_of(encode_step(rows)).find("row starts"), std::string::npos);
  TpStep tables = paged_step();
  tables.block_tables.pop_back();
  EXPECT_NE(error_of(encode_step(tables)).find("block-table"), std::string::npos);
  TpStep logits = paged_step();
  logits.logit_rows = {2, 9};
  EXPECT_NE(error_of(encode_step(logits)).find("logit row 9"), std::string::npos);
  TpStep empty;
  EXPECT_NE(error_of(encode_step(empty)).find("no tokens"), std::string::npos);
}

TEST(TpStep, BroadcastCarriesRankZerosBytes) {
  constexpr int W = 3;
  InProcessGroup g(W);
  std::vector<std::vector<std::vector<uint8_t>>> got(W);
  std::vector<std::thread> ts;
  for (int r = 0; r < W; ++r)
    ts.emplace_back([&, r] {
      for (int round = 0; round < 4; ++round) {
        std::vector<uint8_t> b;
        if (r == 0) b.assign(size_t(round * 37), uint8_t(round + 1));
        else b.assign(5, 0xee);  // overwritten: the size follows rank 0's
        g.comm(r).broadcast_bytes(b);
        got[size_t(r)].push_back(b);
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 1; r < W; ++r) EXPECT_EQ(got[size_t(r)], got[0]) << "rank " << r;
  EXPECT_EQ(got[0][3], std::vector<uint8_t>(111, 4));
}

WeightPolicy f32_policy() {
  WeightPolicy p;
  p.dense_store = DType::F32;
  return p;
}

constexpr int64_t kCtx = 128, kMaxRows = 128;

struct Rank {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Decoder> dec;
  std::unique_ptr<TpStepRunner> runner;
};

Rank make_rank(const ModelConfig& cfg, const ArchFlags& arch, const WeightStore& store, const TpShard& s, bool paged) {
  Rank k;
  k.be = make_cpu_backend({DType::F32, 1});
  k.dec = std::make_unique<Decoder>(cfg, arch, *k.be, store, f32_policy(), kMaxRows, nullptr, s);
  if (paged) k.be->kv_allocate_paged({cfg.n_layers, k.dec->kv_heads(), cfg.head_dim, 0, DType::F32}, 8, 16);
  else k.be->kv_allocate({cfg.n_layers, k.dec->kv_heads(), cfg.head_dim, kCtx, DType::F32});
  k.runner = std::make_unique<TpStepRunner>(*k.dec, *k.be);
  return k;
}

// Rank 0's script: the prompt, then greedy steps from its own logits (the followers never see a
// token before rank 0 sends it); returns every forward's logits.
std::vector<std::vector<float>> greedy_script(const std::function<void(const TpStep&, Act)>& fwd, Backend& be,
                                              const ModelConfig& cfg, const std::vector<int32_t>& prompt, int n_new) {
  const int64_t V = cfg.vocab_size;
  auto lb = be.alloc(size_t(V) * 4);
  const Act lg{lb->data(), DType::F32, 1, V};
  std::vector<std::vector<float>> out;
  TpStep s;
  s.ids = prompt;
  for (int i = 0; i <= n_new; ++i) {
    fwd(s, lg);
    out.emplace_back(size_t(V));
    be.download(out.back().data(), lg.data, lg.bytes());
    s.pos0 += int32_t(s.ids.size());
    s.ids = {int32_t(std::max_element(out.back().begin(), out.back().end()) - out.back().begin())};
  }
  return out;
}

// The unsharded logits, then the same script led by rank 0 of `world` ranks.
void expect_led_equals_unsharded(const std::string& model, int world) {
  const std::string dir = model_dir(model);
  const ModelConfig cfg = load_model_config(dir);
  const ArchFlags arch = resolve_arch(cfg);
  auto store = WeightStore::open_dir(dir);
  const auto prompt = Golden(model).i32("tokens_1");
  Rank one = make_rank(cfg, arch, *store, TpShard{0, 1, nullptr}, false);
  const auto want = greedy_script([&](const TpStep& s, Act lg) { one.runner->run(s, lg); }, *one.be, cfg, prompt, 6);

  InProcessGroup g(world);
  std::vector<Rank> ranks(static_cast<size_t>(world));
  std::vector<std::vector<float>> got;
  std::vector<int64_t> followed(static_cast<size_t>(world), -1);
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        ranks[size_t(r)] = make_rank(cfg, arch, *store, TpShard{r, world, &g.comm(r)}, false);
        Rank& k = ranks[size_t(r)];
        if (r == 0) {
          TpLeader lead(g.comm(0), *k.runner);
          got = greedy_script([&](const TpStep& s, Act lg) { lead.forward(s, lg); }, *k.be, cfg, prompt, 6);
          lead.stop();
        } else {
          followed[size_t(r)] = tp_follow(g.comm(r), *k.runner);
        }
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
        g.comm(r).abort();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[size_t(r)], "") << "rank " << r;
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    double d = 0, scale = 1;
    for (size_t j = 0; j < want[i].size(); ++j) {
      d = std::max(d, std::fabs(double(got[i][j]) - want[i][j]));
      scale = std::max(scale, std::fabs(double(want[i][j])));
    }
    EXPECT_LE(d, 1e-4 * scale) << model << " world " << world << " forward " << i;
  }
  for (int r = 1; r < world; ++r) EXPECT_EQ(followed[size_t(r)], int64_t(want.size())) << "rank " << r;
}

TEST(TpStep, FollowersRunWhatRankZeroLeads) {
  for (const char* model : {"llama-gqa-hd64", "qwen3moe-topk", "qwen2-bias"})
    for (int world : {2, 4}) expect_led_equals_unsharded(model, world);
}

// A step over two sequences of the paged cache, led by rank 0: its logit rows equal the
// unsharded decoder's.
TEST(TpStep, PagedStepLedByRankZero) {
  const std::string model = "llama-gqa-hd64", dir = model_dir(model);
  const ModelConfig cfg = load_model_config(dir);
  const ArchFlags arch = resolve_arch(cfg);
  auto store = WeightStore::open_dir(dir);
  const int64_t V = cfg.vocab_size;
  TpStep s;
  s.ids = {11, 12, 13, 14, 21, 22, 23};
  s.row_start = {0, 4, 7};
  s.seq_pos0 = {0, 0};
  s.block_tables = {0, 1, 2, 3, 4, 5, 6, 7};
  s.max_blocks = 4;
  s.n_logits = 2;
  s.logit_rows = {3, 6};
  auto run_on = [&](Rank& k, const std::function<void(Act)>& fwd) {
    auto lb = k.be->alloc(size_t(2 * V) * 4);
    const Act lg{lb->data(), DType::F32, 2, V};
    fwd(lg);
    std::vector<float> out(size_t(2 * V));
    k.be->download(out.data(), lg.data, lg.bytes());
    return out;
  };
  Rank one = make_rank(cfg, arch, *store, TpShard{0, 1, nullptr}, true);
  const auto want = run_on(one, [&](Act lg) { one.runner->run(s, lg); });
  InProcessGroup g(2);
  std::vector<float> got;
  std::string err0, err1;  // a failing rank aborts the group: the other cannot wait for it forever
  std::thread follower([&] {
    try {
      Rank k = make_rank(cfg, arch, *store, TpShard{1, 2, &g.comm(1)}, true);
      tp_follow(g.comm(1), *k.runner);
    } catch (const std::exception& e) {
      err1 = e.what();
      g.comm(1).abort();
    }
  });
  try {
    Rank k0 = make_rank(cfg, arch, *store, TpShard{0, 2, &g.comm(0)}, true);
    TpLeader lead(g.comm(0), *k0.runner);
    got = run_on(k0, [&](Act lg) { lead.forward(s, lg); });
    lead.stop();
  } catch (const std::exception& e) {
    err0 = e.what();
    g.comm(0).abort();
  }
  follower.join();
  ASSERT_EQ(err0, "");
  ASSERT_EQ(err1, "");
  double d = 0;
  for (size_t j = 0; j < want.size(); ++j) d = std::max(d, std::fabs(double(got[j]) - want[j]));
  EXPECT_LE(d, 1e-3);
}

}  // namespace
