// The batched engine on the GPU: steps over several sequences in the paged KV cache (paged
// rope/kv_write, flash-decoding over block tables with ragged lengths, prompt chunks through the
// prompt kernels over their gathered blocks, the gather of logit rows, sampling of many rows).
//  - One forward over the three golden sequences at once (prompt rows of three sequences), then
//    the rest of each one token per step for all three together: the log-probs of every position
//    stay within the bf16 tolerance of the goldens that the single-sequence score meets.
//  - BatchRunner (continuous batching, chunked prompts sharing steps with decodes, a prefix shared
//    by several requests): each request's greedy tokens equal the same prompt generated alone, and
//    with f32 compute seeded sampling gives the same tokens too; every block is free after the run.
//  - Decode-only steps replayed as captured graphs give the tokens of uncaptured steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "cuda_test_util.h"
#include "nf4flash/engine.h"
#include "runtime/batch_runner.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

using namespace nf4flash;
using namespace nf4flash::test;

namespace {

struct BatchCase {
  const char* model;
  const char* variant;  // golden variant
  QuantChoice quant;
  bool dq;
  ComputeDType compute;
  AttnChoice attn;
};

std::unique_ptr<Engine> load_gpu(const BatchCase& c, bool graphs = true) {
  LoadOptions o;
  o.graphs = graphs;
  o.model_dir = model_dir(c.model);
  o.device = DeviceChoice::CUDA;
  o.compute = c.compute;
  o.quant = c.quant;
  o.double_quant = c.dq;
  o.attn = c.attn;
  o.ctx_size = 256;
  o.load_tokenizer = false;
  return Engine::load(o);
}

std::string case_name(const BatchCase& c) {
  return cat(c.model, " ", c.variant, " attn ", int(c.attn));
}

// log p(next) of each row from f32 logits rows
std::vector<float> next_logprobs(const std::vector<float>& logits, int64_t V, const std::vector<int32_t>& next) {
  std::vector<float> lp;
  for (size_t r = 0; r < next.size(); ++r) {
    const float* l = logits.data() + r * V;
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, double(l[j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(l[j]) - mx);
    lp.push_back(float(double(l[next[r]]) - mx - std::log(s)));
  }
  return lp;
}

// One forward of a paged step: sequence i contributes tokens [from[i], to[i]) of seqs[i]; its
// blocks are [i * per_seq, (i + 1) * per_seq). Returns the f32 logits of every row.
std::vector<float> paged_forward(Engine& e, const std::vector<std::vector<int32_t>>& seqs, const std::vector<int>& from,
                                 const std::vector<int>& to, int per_seq) {
  Engine::Impl& im = e.internals();
  Backend& be = *im.be;
  const int n = int(seqs.size());
  std::vector<int32_t> ids, row_start{0}, pos0, tables;
  for (int i = 0; i < n; ++i) {
    ids.insert(ids.end(), seqs[size_t(i)].begin() + from[size_t(i)], seqs[size_t(i)].begin() + to[size_t(i)]);
    row_start.push_back(int32_t(ids.size()));
    pos0.push_back(from[size_t(i)]);
    for (int b = 0; b < per_seq; ++b) tables.push_back(i * per_seq + b);
  }
  const int64_t T = int64_t(ids.size()), V = e.vocab_size();
  std::vector<int32_t> rows(static_cast<size_t>(T));
  for (int64_t r = 0; r < T; ++r) rows[size_t(r)] = int32_t(r);
  auto up = [&](const std::vector<int32_t>& v) {
    auto b = be.alloc(v.size() * 4);
    be.upload(b->data(), v.data(), v.size() * 4);
    return b;
  };
  auto idb = up(ids), rsb = up(row_start), p0b = up(pos0), tbb = up(tables), rb = up(rows);
  auto lg = be.alloc(size_t(T * V) * 4);
  PagedSeqs ps;
  ps.n_seqs = n;
  ps.row_start = static_cast<const int32_t*>(rsb->data());
  ps.pos0 = static_cast<const int32_t*>(p0b->data());
  ps.block_tables = static_cast<const int32_t*>(tbb->data());
  ps.max_blocks = per_seq;
  ps.row_start_host = row_start.data();
  ps.pos0_host = pos0.data();
  StepState s;
  s.paged = &ps;
  im.dec->forward(static_cast<const int32_t*>(idb->data()), T, s, Act{lg->data(), DType::F32, T, V}, T,
                  static_cast<const int32_t*>(rb->data()));
  std::vector<float> out(size_t(T * V));
  be.download(out.data(), lg->data(), out.size() * 4);
  return out;
}

class GpuBatch : public ::testing::TestWithParam<BatchCase> {};

TEST_P(GpuBatch, PagedStepsMatchGoldens) {
  NF4FLASH_REQUIRE_CUDA();
  const BatchCase c = GetParam();
  Golden g(c.model);
  auto e = load_gpu(c);
  Engine::Impl& im = e->internals();
  const int64_t V = e->vocab_size();
  const int bs = 8, per_seq = 256 / bs;
  std::vector<std::vector<int32_t>> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(g.i32(cat("tokens_", i)));
  im.be->kv_allocate_paged(im.be->kv_desc(), 3 * per_seq, bs);
  // prompt rows of the three sequences in one step (the first two thirds of each), then the rest one
  // row per sequence and step
  std::vector<int> from(3, 0), to(3);
  for (int i = 0; i < 3; ++i) to[size_t(i)] = int(seqs[size_t(i)].size()) * 2 / 3;
  std::vector<std::vector<float>> lp(3);
  {
    const std::vector<float> l = paged_forward(*e, seqs, from, to, per_seq);
    int64_t r0 = 0;
    for (int i = 0; i < 3; ++i) {
      const int n = to[size_t(i)];
      std::vector<int32_t> next(seqs[size_t(i)].begin() + 1, seqs[size_t(i)].begin() + n + 1);
      const std::vector<float> rows(l.begin() + r0 * V, l.begin() + (r0 + n) * V);
      const auto p = next_logprobs(rows, V, next);
      lp[size_t(i)].insert(lp[size_t(i)].end(), p.begin(), p.end());
      r0 += n;
    }
  }
  // each step runs all three sequences on their own blocks; one already at its end recomputes its
  // last position (the same K/V again)
  for (;;) {
    std::vector<int> idx, f3(3), t3(3);
    for (int i = 0; i < 3; ++i) {
      const int last = int(seqs[size_t(i)].size()) - 2;
      if (to[size_t(i)] <= last) idx.push_back(i);
      f3[size_t(i)] = std::min(to[size_t(i)], last);
      t3[size_t(i)] = f3[size_t(i)] + 1;
    }
    if (idx.empty()) break;
    const std::vector<float> l = paged_forward(*e, seqs, f3, t3, per_seq);
    for (size_t j = 0; j < idx.size(); ++j) {
      const int i = idx[j];
      const std::vector<float> row(l.begin() + int64_t(i) * V, l.begin() + int64_t(i + 1) * V);
      const auto p = next_logprobs(row, V, {seqs[size_t(i)][size_t(to[size_t(i)] + 1)]});
      lp[size_t(i)].push_back(p[0]);
      ++to[size_t(i)];
    }
  }
  std::vector<float> got, ref, lp16, lp32;
  for (int i = 0; i < 3; ++i) {
    auto app = [](std::vector<float>& d, const std::vector<float>& s) { d.insert(d.end(), s.begin(), s.end()); };
    ASSERT_EQ(lp[size_t(i)].size(), seqs[size_t(i)].size() - 1) << "sequence " << i;
    app(got, lp[size_t(i)]);
    app(ref, g.f32(cat("nextlogprob_", c.variant, "_", i)));
    app(lp16, g.f32(cat("nextlogprob_bf16_", i)));
    app(lp32, g.f32(cat("nextlogprob_f32_", i)));
  }
  const double tol = std::string(c.variant) == "f32" ? 1e-3 : 2 * rel_l2(lp16, lp32);
  EXPECT_LE(rel_l2(got, ref), tol) << case_name(c) << " batched log-probs";
  KVCacheDesc d = im.be->kv_desc();
  d.capacity = im.ctx;
  im.be->kv_allocate(d);
}

TEST_P(GpuBatch, BatchRunnerTokensEqualEachAlone) {
  NF4FLASH_REQUIRE_CUDA();
  const BatchCase c = GetParam();
  Golden g(c.model);
  auto e = load_gpu(c);
  const int64_t V = e->vocab_size();
  // golden prompts, a long prompt (chunked), prompts sharing a prefix, seeded sampling
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(g.i32(cat("tokens_", i)));
  std::vector<int32_t> lng;
  for (int k = 0; k < 90; ++k) lng.push_back(int32_t((7 + 31 * k) % (V - 1) + 1));
  prompts.push_back(lng);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p(prompts[1].begin(), prompts[1].end());
    for (int k = 0; k <= i; ++k) p.push_back(int32_t((11 + 13 * k + 97 * i) % (V - 1) + 1));
    prompts.push_back(p);
  }
  std::vector<GenerateOptions> gens(prompts.size());
  std::vector<GenerateResult> alone;
  for (size_t i = 0; i < prompts.size(); ++i) {
    gens[i].max_new_tokens = 6 + int(i % 3) * 5;
    gens[i].ignore_eos = true;
    gens[i].reuse_cache = false;
    if (i % 3 == 2) {
      gens[i].sampling.temperature = 0.8f;
      gens[i].sampling.top_k = 20;
      gens[i].sampling.seed = 40 + i;
    }
    alone.push_back(e->generate(prompts[i], gens[i]));
  }
  BatchRunnerOptions o;
  o.block_size = 16;
  o.sched.max_seqs_per_step = 4;
  o.sched.max_tokens_per_step = 48;  // the long prompt takes several chunks beside running decodes
  std::map<int64_t, BatchOutput> got;
  {
    BatchRunner r(*e, o);
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (i == 4)
        for (int s = 0; s < 3; ++s)
          for (BatchOutput& b : r.step()) got[b.id] = std::move(b);
      const SubmitResult s = r.submit({int64_t(i), prompts[i], gens[i]});
      ASSERT_TRUE(s.ok()) << s.error;
    }
    for (int s = 0; r.has_work() && s < 2000; ++s)
      for (BatchOutput& b : r.step()) got[b.id] = std::move(b);
    EXPECT_FALSE(r.has_work());
    EXPECT_EQ(r.pool().available_blocks(), r.pool().n_blocks()) << "blocks leaked";
  }
  ASSERT_EQ(got.size(), prompts.size());
  int64_t cached = 0;
  // greedy ids equal everywhere; sampled ones where the arithmetic of a batched step is that of a
  // lone one (f32 compute: GEMV and GEMM agree to f32 rounding). In bf16 the batched rows take the
  // GEMM (f32 products of the 4-bit codes) where a lone decode takes the GEMV (16-bit products), and
  // a temperature draw near a probability boundary may then pick the neighbour.
  const bool exact = std::string(c.variant) == "f32";
  for (size_t i = 0; i < prompts.size(); ++i) {
    const BatchOutput& b = got.at(int64_t(i));
    if (gens[i].sampling.greedy() || exact) EXPECT_EQ(b.tokens, alone[i].tokens) << case_name(c) << " request " << i;
    else EXPECT_EQ(b.tokens.size(), alone[i].tokens.size()) << case_name(c) << " request " << i;
    EXPECT_EQ(b.finish_reason, "length") << case_name(c) << " request " << i;
    cached += b.cached_tokens;
  }
  EXPECT_GT(cached, 0) << "no prefix-cache hit";
  GenerateOptions g0 = gens[0];
  EXPECT_EQ(e->generate(prompts[0], g0).tokens, alone[0].tokens) << "the contiguous cache after the runner";
}

// Decode-only steps replay one captured graph per shape (sequences, block-table width): the
// tokens equal those of the same requests run with graphs off, through sequences joining and
// leaving (shapes of 1-4 sequences), a sequence's table outgrowing a width (past 8 blocks), a long
// prompt arriving after graphs were captured (its chunks grow workspaces: recaptured), and seeded
// sampling (same kernels, same draws).
TEST_P(GpuBatch, GraphedDecodeStepsEqualUncaptured) {
  NF4FLASH_REQUIRE_CUDA();
  const BatchCase c = GetParam();
  Golden g(c.model);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 3; ++i) prompts.push_back(g.i32(cat("tokens_", i)));
  auto run = [&](bool graphs, size_t& captured) {
    auto e = load_gpu(c, graphs);
    const int64_t V = e->vocab_size();
    std::vector<int32_t> lng;
    for (int k = 0; k < 100; ++k) lng.push_back(int32_t((5 + 37 * k) % (V - 1) + 1));
    BatchRunnerOptions bo;
    bo.block_size = 16;
    bo.sched.max_seqs_per_step = 4;
    bo.sched.max_tokens_per_step = 32;
    std::map<int64_t, std::vector<int32_t>> got;
    BatchRunner r(*e, bo);
    for (int i = 0; i < 3; ++i) {
      GenerateOptions gen;
      gen.max_new_tokens = i == 0 ? 140 : 12 + 9 * i;  // request 0 ends past 128 positions: 9+ blocks
      gen.ignore_eos = true;
      gen.reuse_cache = false;
      if (i == 2) {
        gen.sampling.temperature = 0.8f;
        gen.sampling.top_k = 20;
        gen.sampling.seed = 7;
      }
      EXPECT_TRUE(r.submit({int64_t(i), prompts[size_t(i)], gen}).ok());
    }
    size_t before_long = 0;
    for (int s = 0; r.has_work() && s < 2000; ++s) {
      for (BatchOutput& b : r.step()) got[b.id] = b.tokens;
      if (s == 30) {  // decode-only steps have run: a prompt of 4 chunks joins
        before_long = r.step_graphs();
        GenerateOptions gen;
        gen.max_new_tokens = 20;
        gen.ignore_eos = true;
        gen.reuse_cache = false;
        EXPECT_TRUE(r.submit({3, lng, gen}).ok());
      }
    }
    EXPECT_FALSE(r.has_work());
    EXPECT_EQ(before_long > 0, graphs) << "graphs " << graphs << ": decode steps captured before the long prompt";
    captured = r.step_graphs();
    return got;
  };
  size_t on = 0, off = 0;
  const auto with = run(true, on), without = run(false, off);
  EXPECT_GT(on, size_t{2}) << case_name(c) << ": decode-only shapes captured";
  EXPECT_EQ(off, size_t{0});
  ASSERT_EQ(with.size(), size_t{4});
  ASSERT_EQ(without.size(), size_t{4});
  for (const auto& [id, toks] : without) EXPECT_EQ(with.at(id), toks) << case_name(c) << " request " << id;
}

const BatchCase kBatchCases[] = {
    {"llama-gqa-hd64", "f32", QuantChoice::Auto, false, ComputeDType::F32, AttnChoice::Auto},
    {"llama-gqa-hd64", "nf4", QuantChoice::NF4, true, ComputeDType::BF16, AttnChoice::Auto},
    {"llama3-hd128-ropescaled", "bf16", QuantChoice::Auto, false, ComputeDType::BF16, AttnChoice::Auto},
    {"llama3-hd128-ropescaled", "bf16", QuantChoice::Auto, false, ComputeDType::BF16, AttnChoice::Sdpa},
    {"qwen2-bias", "bf16", QuantChoice::Auto, false, ComputeDType::BF16, AttnChoice::Eager},
    // head_dim 256 with soft-capping and sliding-window layers; a window with q/k norms; 80 and 32
    {"gemma2-hd256-softcap", "bf16", QuantChoice::Auto, false, ComputeDType::BF16, AttnChoice::Auto},
    {"gemma3-qknorm-window", "f32", QuantChoice::Auto, false, ComputeDType::F32, AttnChoice::Auto},
    {"llama-hd80", "bf16", QuantChoice::Auto, false, ComputeDType::BF16, AttnChoice::Sdpa},
    {"mistral-hd32", "f32", QuantChoice::Auto, false, ComputeDType::F32, AttnChoice::Auto},
    // mixtures of experts: routing on the GPU over the rows of several sequences
    {"qwen3moe-topk", "f32", QuantChoice::Auto, false, ComputeDType::F32, AttnChoice::Auto},
    {"qwen2moe-shared", "bf16", QuantChoice::Auto, false, ComputeDType::BF16, AttnChoice::Auto},
    {"mixtral-moe", "bf16", QuantChoice::Auto, false, ComputeDType::BF16, AttnChoice::Auto},
};

INSTANTIATE_TEST_SUITE_P(Models, GpuBatch, ::testing::ValuesIn(kBatchCases), [](const auto& info) {
  std::string s = cat(info.param.model, "_", info.param.variant, "_attn", int(info.param.attn));
  for (auto& ch : s)
    if (ch == '-' || ch == '.') ch = '_';
  return s;
});

}  // namespace
