// A randomized run of the paged KV bookkeeping (kv/block_pool.h): thousands of attach / reserve /
// cache / fork / release operations over many sequences on a small pool, with a fixed seed.
// A shadow copy of every block's contents stands in for the backend: reserve's copies are applied
// to it, and each computed position writes a fingerprint of the whole prefix through it (as K and V
// depend on every earlier token). After every operation each live sequence must read its own
// fingerprints back, so a wrongly shared block (even one with equal tokens after a different
// prefix), a missed copy-on-write or a write into a block another sequence holds shows up.
// check() runs after every operation; the pool ends with every block free or evictable. One run
// uses a hash with four values, so that lookups meet other prefixes' entries all the time.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>
#include <vector>

#include "kv/block_pool.h"

using namespace nf4flash;

namespace {

struct Seq {
  KvBlockTable t;
  std::vector<int32_t> toks;  // the sequence's tokens; positions [0, t.n_tokens) are computed
  std::vector<uint64_t> fp;   // fingerprint of the prefix through each position
};

// The fingerprint of a prefix one token longer (splitmix64 of the previous one and the token).
uint64_t extend(uint64_t fp, int32_t tok) {
  uint64_t h = fp + 0x9e3779b97f4a7c15ull * (static_cast<uint32_t>(tok) + 1);
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

std::vector<uint64_t> fingerprints(const std::vector<int32_t>& toks) {
  std::vector<uint64_t> fp;
  for (int32_t t : toks) fp.push_back(extend(fp.empty() ? 1 : fp.back(), t));
  return fp;
}

class Stress {
 public:
  Stress(int64_t n_blocks, int bs, uint32_t seed, KvBlockPool::HashFn hash)
      : pool_(n_blocks, bs), bs_(bs), rng_(seed), shadow_(n_blocks, std::vector<uint64_t>(bs, 0)) {
    if (hash) pool_.set_hash_for_testing(hash);
    for (int i = 0; i < 4; ++i) prompts_.push_back(random_tokens(uniform(0, 3 * bs)));
  }

  void run(int n_ops) {
    for (int op = 0; op < n_ops; ++op) {
      const int r = uniform(0, 99);
      if (seqs_.empty() || (r < 25 && seqs_.size() < 12)) start();
      else if (r < 70) step(pick());
      else if (r < 80 && seqs_.size() < 12) fork(pick());
      else release(pick());
      verify(op);
      if (::testing::Test::HasFatalFailure()) return;
    }
    while (!seqs_.empty()) release(0);
    verify(n_ops);
    EXPECT_EQ(pool_.free_blocks() + pool_.evictable_blocks(), pool_.n_blocks());
    EXPECT_EQ(pool_.evictable_blocks(), pool_.cached_blocks());
    // The run must have exercised every path.
    EXPECT_GT(hits_, 0);
    if (bs_ > 1) EXPECT_GT(copies_, 0);  // with one position a block, no block is partly filled
    EXPECT_GT(refused_, 0);
    EXPECT_GT(evictions_, 0);
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  size_t pick() { return static_cast<size_t>(uniform(0, static_cast<int>(seqs_.size()) - 1)); }
  std::vector<int32_t> random_tokens(int n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = uniform(0, 3);  // a small vocabulary: equal blocks happen by chance too
    return v;
  }

  // Reserve n more positions for s and compute them: apply the copies, write the tokens.
  bool grow(Seq& s, const std::vector<int32_t>& more) {
    const int64_t n = static_cast<int64_t>(more.size());
    const int64_t need = pool_.blocks_needed(s.t, n), avail = pool_.available_blocks();
    const int64_t cached_before = pool_.cached_blocks();
    const KvBlockTable before = s.t;
    std::vector<KvBlockCopy> copies;
    const bool ok = pool_.reserve(s.t, n, &copies);
    EXPECT_EQ(ok, need <= avail) << "need " << need << " of " << avail;
    if (!ok) {
      ++refused_;
      EXPECT_EQ(s.t.blocks, before.blocks);
      EXPECT_EQ(s.t.n_tokens, before.n_tokens);
      EXPECT_TRUE(copies.empty());
      return false;
    }
    const int64_t taken = static_cast<int64_t>(s.t.blocks.size() - before.blocks.size()) + !copies.empty();
    EXPECT_EQ(taken, need);
    evictions_ += std::max<int64_t>(0, cached_before - pool_.cached_blocks());
    EXPECT_LE(copies.size(), 1u);
    for (const KvBlockCopy& c : copies) {
      ++copies_;
      EXPECT_EQ(c.src, before.blocks.back());
      EXPECT_EQ(c.dst, s.t.blocks[before.blocks.size() - 1]);
      EXPECT_EQ(c.n_tokens, before.n_tokens % bs_);
      std::copy(shadow_[c.src].begin(), shadow_[c.src].begin() + c.n_tokens, shadow_[c.dst].begin());
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = before.n_tokens + i;
      const int32_t b = s.t.blocks[p / bs_];
      // The block written must be this sequence's alone and not cached.
      EXPECT_FALSE(pool_.is_cached(b)) << "write into cached block " << b;
      EXPECT_EQ(pool_.ref_count(b), 1) << "write into shared block " << b;
      s.fp.push_back(extend(s.fp.empty() ? 1 : s.fp.back(), more[i]));
      shadow_[b][p % bs_] = s.fp.back();
    }
    s.toks.insert(s.toks.end(), more.begin(), more.end());
    return true;
  }

  void start() {
    Seq s;
    std::vector<int32_t> prompt;
    const int kind = uniform(0, 2);
    if (kind == 0 && !seqs_.empty()) prompt = seqs_[pick()]->toks;  // an earlier turn or sample
    else if (kind == 1) prompt = prompts_[uniform(0, static_cast<int>(prompts_.size()) - 1)];
    auto tail = random_tokens(uniform(1, 2 * bs_));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const int64_t cached = pool_.attach_prefix(s.t, prompt);
    EXPECT_EQ(cached % bs_, 0);
    EXPECT_LE(cached, static_cast<int64_t>(prompt.size()) - 1);
    if (cached > 0) ++hits_;
    const std::vector<uint64_t> fp = fingerprints(prompt);
    for (int64_t p = 0; p < cached; ++p)  // the shared blocks hold exactly this prompt's prefix
      ASSERT_EQ(shadow_[s.t.blocks[p / bs_]][p % bs_], fp[p]) << "wrong block shared at " << p;
    s.toks.assign(prompt.begin(), prompt.begin() + cached);
    s.fp.assign(fp.begin(), fp.begin() + cached);
    if (!grow(s, std::vector<int32_t>(prompt.begin() + cached, prompt.end()))) {
      pool_.release(s.t);
      return;
    }
    pool_.cache_full_blocks(s.t, s.toks);
    seqs_.push_back(std::make_unique<Seq>(std::move(s)));
  }

  void step(size_t i) {
    Seq& s = *seqs_[i];
    if (!grow(s, random_tokens(uniform(1, bs_ + 1)))) return;
    if (uniform(0, 4) > 0) pool_.cache_full_blocks(s.t, s.toks);
  }

  void fork(size_t i) {
    auto s = std::make_unique<Seq>();
    s->t = pool_.fork(seqs_[i]->t);
    s->toks = seqs_[i]->toks;
    s->fp = seqs_[i]->fp;
    seqs_.push_back(std::move(s));
  }

  void release(size_t i) {
    pool_.release(seqs_[i]->t);
    EXPECT_TRUE(seqs_[i]->t.blocks.empty());
    seqs_.erase(seqs_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  void verify(int op) {
    std::vector<const KvBlockTable*> live;
    std::set<int32_t> held;
    for (const auto& s : seqs_) {
      live.push_back(&s->t);
      held.insert(s->t.blocks.begin(), s->t.blocks.end());
      ASSERT_EQ(static_cast<int64_t>(s->toks.size()), s->t.n_tokens);
      for (int64_t p = 0; p < s->t.n_tokens; ++p)
        ASSERT_EQ(shadow_[s->t.blocks[p / bs_]][p % bs_], s->fp[p]) << "op " << op << " position " << p;
    }
    ASSERT_NO_THROW(pool_.check(live)) << "op " << op;
    // The budget: tables and cache never hold more than the pool has.
    ASSERT_LE(static_cast<int64_t>(held.size()) + pool_.free_blocks() + pool_.evictable_blocks(),
              pool_.n_blocks());
  }

  KvBlockPool pool_;
  int bs_;
  std::mt19937 rng_;
  std::vector<std::vector<uint64_t>> shadow_;
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<std::unique_ptr<Seq>> seqs_;
  int64_t hits_ = 0, copies_ = 0, refused_ = 0, evictions_ = 0;
};

// Four hash values in all: most lookups meet entries of other prefixes under the same hash.
uint64_t weak_hash(uint64_t prefix_hash, const int32_t* tokens, int n) {
  uint64_t h = prefix_hash;
  for (int i = 0; i < n; ++i) h = h * 31 + static_cast<uint32_t>(tokens[i]);
  return h % 4;
}

TEST(KvBlockPoolStress, RandomOperationsKeepTheInvariants) {
  struct Config {
    int64_t n_blocks;
    int bs;
    KvBlockPool::HashFn hash;
  };
  for (const Config c : {Config{40, 4, nullptr}, Config{24, 1, nullptr}, Config{30, 3, nullptr},
                         Config{64, 16, nullptr}, Config{40, 2, &weak_hash}}) {
    SCOPED_TRACE(::testing::Message() << c.n_blocks << " blocks of " << c.bs << (c.hash ? ", weak hash" : ""));
    Stress s(c.n_blocks, c.bs, 1234u + static_cast<uint32_t>(c.bs), c.hash);
    s.run(5000);
  }
}

}  // namespace
