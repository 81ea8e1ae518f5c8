// A step over several sequences on the CPU backend's paged KV cache (StepState::paged,
// kv_allocate_paged, Decoder::forward with logit rows): three sequences with their blocks
// scattered over the pool, prefill chunks and single-token steps mixed in one step, give logits
// equal to each sequence's own full forward (Engine::score over the contiguous cache), bit for
// bit. And the paged and contiguous layouts refuse each other's steps by name.
#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"
#include "nf4flash/engine.h"
#include "runtime/engine_impl.h"
#include "test_util.h"

namespace nf4flash {
namespace {

std::unique_ptr<Engine> load_cpu(const std::string& model, QuantChoice quant) {
  return test::load_cpu_engine(model, quant, 256);
}

// Backend memory holding `v` (int32).
std::unique_ptr<Buffer> ints(Backend& be, const std::vector<int32_t>& v) {
  auto b = be.alloc(std::max<size_t>(v.size(), 1) * 4);
  be.upload(b->data(), v.data(), v.size() * 4);
  return b;
}

void expect_paged_equals_solo(const std::string& model, QuantChoice quant) {
  SCOPED_TRACE(model);
  auto e = load_cpu(model, quant);
  const int64_t V = e->vocab_size();
  // three sequences of different lengths (ids well inside the vocabulary)
  std::vector<std::vector<int32_t>> seqs(3);
  const int64_t lens[3] = {9, 12, 14};
  for (int i = 0; i < 3; ++i)
    for (int64_t p = 0; p < lens[i]; ++p) seqs[size_t(i)].push_back(int32_t((7 + 31 * p + 101 * i) % (V - 1) + 1));
  std::vector<std::vector<std::vector<float>>> solo;  // per sequence, per position: the logits
  for (const auto& s : seqs) solo.push_back(e->score(s, false, true).logits);

  auto& im = e->internals();
  Backend& be = *im.be;
  const int bs = 4, max_blocks = 4, n_blocks = 12;
  be.kv_allocate_paged(be.kv_desc(), n_blocks, bs);
  // block k of sequence i is block 3k + i: the sequences' blocks interleaved over the pool
  std::vector<int32_t> tables(3 * max_blocks);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < max_blocks; ++k) tables[size_t(i * max_blocks + k)] = 3 * k + i;
  auto tb = ints(be, tables);
  // two steps: (positions of each sequence) [0,5) [0,9) [0,1), then [5,9) [9,12) [1,14)
  const int64_t cut[3] = {5, 9, 1};
  const int64_t zero[3] = {0, 0, 0};
  for (int step = 0; step < 2; ++step) {
    // each sequence's last row gives logits
    const test::PagedStepRows r = test::paged_step_rows(seqs, step == 0 ? zero : cut, step == 0 ? cut : lens);
    const std::vector<int32_t>& ids = r.ids;
    auto idb = ints(be, ids), rsb = ints(be, r.row_start), p0b = ints(be, r.pos0), lrb = ints(be, r.logit_rows);
    PagedSeqs ps;
    ps.n_seqs = 3;
    ps.row_start = static_cast<const int32_t*>(rsb->data());
    ps.pos0 = static_cast<const int32_t*>(p0b->data());
    ps.block_tables = static_cast<const int32_t*>(tb->data());
    ps.max_blocks = max_blocks;
    StepState s;
    s.paged = &ps;
    auto lg = be.alloc(size_t(3 * V) * 4);
    const Act logits{lg->data(), DType::F32, 3, V};
    im.dec->forward(static_cast<const int32_t*>(idb->data()), int64_t(ids.size()), s, logits, 3,
                    static_cast<const int32_t*>(lrb->data()));
    std::vector<float> got(size_t(3 * V));
    be.download(got.data(), lg->data(), got.size() * 4);
    for (int i = 0; i < 3; ++i) {
      const int64_t p = (step == 0 ? cut[i] : lens[i]) - 1;
      const std::vector<float> row(got.begin() + i * V, got.begin() + (i + 1) * V);
      EXPECT_EQ(row, solo[size_t(i)][size_t(p)]) << "sequence " << i << " position " << p << " step " << step;
    }
  }
  // a one-sequence step on the paged cache, and a paged step on a contiguous cache, are refused
  auto one = ints(be, {seqs[0][0]});
  auto pos = ints(be, {0});
  StepState plain;
  plain.pos0 = static_cast<int32_t*>(pos->data());
  auto lg = be.alloc(size_t(V) * 4);
  EXPECT_THROW(im.dec->forward(static_cast<const int32_t*>(one->data()), 1, plain, Act{lg->data(), DType::F32, 1, V}, 1),
               Error);
}

TEST(PagedStep, SeveralSequencesEqualEachAloneF32) { expect_paged_equals_solo("llama-gqa-hd64", QuantChoice::Auto); }

TEST(PagedStep, SeveralSequencesEqualEachAloneNf4) { expect_paged_equals_solo("llama3-hd128-ropescaled", QuantChoice::NF4); }

}  // namespace
}  // namespace nf4flash
