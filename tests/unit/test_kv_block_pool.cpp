// The paged KV cache's bookkeeping (kv/block_pool.h) on hand-made cases: allocation across block
// boundaries, all-or-nothing reserve, prefix sharing (never the prompt's last token), hash
// collisions that must not share wrong blocks, LRU eviction order, fork + copy-on-write, duplicate
// prefixes computed independently, release, argument errors and check() finding a breach.
// The randomized run is in test_kv_block_pool_stress.cpp.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/block_pool.h"

using namespace nf4flash;

namespace {

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A sequence computing its whole prompt: attach, reserve the rest, cache the full blocks.
KvBlockTable compute(KvBlockPool& pool, const std::vector<int32_t>& prompt, int64_t* cached = nullptr) {
  KvBlockTable t;
  const int64_t c = pool.attach_prefix(t, prompt);
  if (cached) *cached = c;
  std::vector<KvBlockCopy> copies;
  EXPECT_TRUE(pool.reserve(t, static_cast<int64_t>(prompt.size()) - c, &copies));
  EXPECT_TRUE(copies.empty());
  pool.cache_full_blocks(t, prompt);
  return t;
}

template <typename F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

uint64_t constant_hash(uint64_t, const int32_t*, int) { return 42; }
uint64_t tokens_only_hash(uint64_t, const int32_t* t, int n) {
  return KvBlockPool::default_hash(KvBlockPool::kPrefixSeed, t, n);
}

TEST(KvBlockPool, AllocatesAcrossBlockBoundaries) {
  KvBlockPool pool(8, 4);
  KvBlockTable t;
  EXPECT_EQ(pool.blocks_needed(t, 3), 1);
  ASSERT_TRUE(pool.reserve(t, 3, nullptr));
  EXPECT_EQ(t.n_tokens, 3);
  EXPECT_EQ(t.blocks.size(), 1u);
  EXPECT_EQ(pool.blocks_needed(t, 1), 0);  // the last block has room
  ASSERT_TRUE(pool.reserve(t, 1, nullptr));
  EXPECT_EQ(t.blocks.size(), 1u);
  EXPECT_EQ(pool.blocks_needed(t, 1), 1);  // exactly full: the next position starts a block
  ASSERT_TRUE(pool.reserve(t, 1, nullptr));
  EXPECT_EQ(t.blocks.size(), 2u);
  EXPECT_EQ(pool.blocks_needed(t, 9), 2);  // 5 + 9 = 14 positions = 4 blocks
  ASSERT_TRUE(pool.reserve(t, 9, nullptr));
  EXPECT_EQ(t.n_tokens, 14);
  EXPECT_EQ(std::set<int32_t>(t.blocks.begin(), t.blocks.end()).size(), 4u);
  EXPECT_EQ(pool.free_blocks(), 4);
  ASSERT_TRUE(pool.reserve(t, 0, nullptr));
  EXPECT_EQ(t.n_tokens, 14);
  pool.check({&t});
  pool.release(t);
  EXPECT_EQ(pool.free_blocks(), 8);
  pool.check({});
}

TEST(KvBlockPool, ReserveIsAllOrNothing) {
  KvBlockPool pool(4, 4);
  KvBlockTable a, b;
  ASSERT_TRUE(pool.reserve(a, 10, nullptr));  // 3 blocks
  EXPECT_EQ(pool.available_blocks(), 1);
  EXPECT_FALSE(pool.reserve(b, 8, nullptr));  // needs 2
  EXPECT_TRUE(b.blocks.empty());
  EXPECT_EQ(b.n_tokens, 0);
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_FALSE(pool.reserve(a, 7, nullptr));  // 17 positions = 5 blocks
  EXPECT_EQ(a.n_tokens, 10);
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_TRUE(pool.reserve(a, 6, nullptr));  // 16 positions = 4 blocks: the last one
  EXPECT_EQ(pool.available_blocks(), 0);
  EXPECT_FALSE(pool.reserve(b, 1, nullptr));
  pool.check({&a, &b});

  // A fork whose next write needs a private copy of the shared last block: no block, no change.
  KvBlockPool p2(2, 4);
  KvBlockTable c;
  ASSERT_TRUE(p2.reserve(c, 6, nullptr));
  KvBlockTable d = p2.fork(c);
  EXPECT_EQ(p2.blocks_needed(d, 1), 1);  // the copy, though the last block has room
  std::vector<KvBlockCopy> copies;
  EXPECT_FALSE(p2.reserve(d, 1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(d.blocks, c.blocks);
  EXPECT_EQ(d.n_tokens, 6);
  p2.check({&c, &d});
}

TEST(KvBlockPoolPrefix, SequencesWithACommonPrefixShareItsBlocks) {
  KvBlockPool pool(32, 4);
  const auto common = iota_tokens(12, 100);  // 3 blocks
  const auto pa = concat(common, iota_tokens(5, 200)), pb = concat(common, iota_tokens(6, 300));
  int64_t ca = -1, cb = -1;
  KvBlockTable a = compute(pool, pa, &ca);
  EXPECT_EQ(ca, 0);
  EXPECT_EQ(pool.cached_blocks(), 4);  // 17 tokens: 4 full blocks
  KvBlockTable b = compute(pool, pb, &cb);
  EXPECT_EQ(cb, 12);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b.blocks[i], a.blocks[i]) << i;
    EXPECT_EQ(pool.ref_count(a.blocks[i]), 3) << i;  // a, b and the cache
  }
  EXPECT_NE(b.blocks[3], a.blocks[3]);
  EXPECT_EQ(b.blocks.size(), 5u);
  EXPECT_EQ(pool.free_blocks(), 32 - 5 - 2);
  pool.check({&a, &b});
  pool.release(a);
  pool.release(b);
  EXPECT_EQ(pool.free_blocks() + pool.evictable_blocks(), 32);
  EXPECT_EQ(pool.evictable_blocks(), pool.cached_blocks());
  pool.check({});
}

TEST(KvBlockPoolPrefix, AttachNeverCoversTheLastToken) {
  KvBlockPool pool(16, 4);
  const auto prompt = iota_tokens(12, 7);  // exactly 3 blocks
  KvBlockTable a = compute(pool, prompt);
  EXPECT_EQ(pool.cached_blocks(), 3);
  KvBlockTable b, c, d, e, f;
  EXPECT_EQ(pool.attach_prefix(b, prompt), 8);  // k blocks long: k - 1 shared
  EXPECT_EQ(b.n_tokens, 8);
  EXPECT_EQ(b.blocks.size(), 2u);
  EXPECT_EQ(pool.attach_prefix(c, concat(prompt, {1})), 12);
  EXPECT_EQ(pool.attach_prefix(d, {7, 8, 9, 10}), 0);  // one block long: nothing shared
  EXPECT_EQ(pool.attach_prefix(e, {}), 0);
  EXPECT_EQ(pool.attach_prefix(f, {7, 8, 9, 10, 11, 12, 13, 99, 1}), 4);  // differs in block 1
  pool.check({&a, &b, &c, &d, &e, &f});
  for (KvBlockTable* t : {&a, &b, &c, &d, &e, &f}) pool.release(*t);
  pool.check({});

  KvBlockPool one(8, 1);  // block_size 1: every token but the last
  KvBlockTable g = compute(one, {1, 2, 3}), h;
  EXPECT_EQ(one.attach_prefix(h, {1, 2, 3}), 2);
  one.check({&g, &h});
}

TEST(KvBlockPoolCollision, EqualHashesNeverShareBlocksOfOtherTokens) {
  KvBlockPool pool(32, 4);
  pool.set_hash_for_testing(&constant_hash);  // every prefix collides with every other
  const std::vector<int32_t> A = {1, 2, 3, 4}, B = {5, 6, 7, 8}, C = {9, 10, 11, 12};
  KvBlockTable ab = compute(pool, concat(concat(A, B), {0})), cb = compute(pool, concat(concat(C, B), {0}));
  EXPECT_EQ(pool.cached_blocks(), 4);
  KvBlockTable x, y, z, w;
  EXPECT_EQ(pool.attach_prefix(x, concat(concat(A, B), {50})), 8);
  EXPECT_EQ(x.blocks, std::vector<int32_t>(ab.blocks.begin(), ab.blocks.begin() + 2));
  EXPECT_EQ(pool.attach_prefix(y, concat(concat(C, B), {50})), 8);
  EXPECT_EQ(y.blocks, std::vector<int32_t>(cb.blocks.begin(), cb.blocks.begin() + 2));
  EXPECT_EQ(pool.attach_prefix(z, concat(concat(C, A), {50})), 4);  // A cached only as a first block
  EXPECT_EQ(pool.attach_prefix(w, concat(concat(B, B), {50})), 0);  // B cached only after A or C
  pool.check({&ab, &cb, &x, &y, &z, &w});
  for (KvBlockTable* t : {&ab, &cb, &x, &y, &z, &w}) pool.release(*t);
  pool.check({});
  expect_error([&] { pool.set_hash_for_testing(&tokens_only_hash); }, "nothing is cached");
}

TEST(KvBlockPoolCollision, EqualBlockAfterADifferentPrefixIsAMiss) {
  KvBlockPool pool(32, 4);
  pool.set_hash_for_testing(&tokens_only_hash);  // a block's hash ignores what came before it
  const std::vector<int32_t> A = {1, 2, 3, 4}, B = {5, 6, 7, 8}, C = {9, 10, 11, 12}, D = {13, 14, 15, 16};
  KvBlockTable ab = compute(pool, concat(concat(A, B), {0})), cd = compute(pool, concat(concat(C, D), {0}));
  KvBlockTable q;
  EXPECT_EQ(pool.attach_prefix(q, concat(concat(C, B), {0})), 4);  // C hits; B's hash and tokens match,
  EXPECT_EQ(q.blocks[0], cd.blocks[0]);                            // but its prefix is A, not C
  pool.check({&ab, &cd, &q});
}

TEST(KvBlockPoolLru, EvictsTheLeastRecentlyReleasedFirst) {
  KvBlockPool pool(6, 2);
  const std::vector<int32_t> px = {1, 2, 3}, py = {4, 5, 6}, pz = {7, 8, 9};
  KvBlockTable x = compute(pool, px), y = compute(pool, py), z = compute(pool, pz);
  const int32_t x0 = x.blocks[0], y0 = y.blocks[0], z0 = z.blocks[0];
  pool.release(x);
  pool.release(y);
  pool.release(z);
  EXPECT_EQ(pool.evictable_blocks(), 3);
  EXPECT_EQ(pool.free_blocks(), 3);
  KvBlockTable again;  // using x again makes it the most recent: order y, z, x
  EXPECT_EQ(pool.attach_prefix(again, px), 2);
  EXPECT_EQ(pool.evictable_blocks(), 2);
  pool.release(again);
  pool.check({});

  KvBlockTable big;
  ASSERT_TRUE(pool.reserve(big, 8, nullptr));  // 3 free blocks, then evicts y0
  EXPECT_FALSE(pool.is_cached(y0));
  EXPECT_TRUE(pool.is_cached(z0));
  EXPECT_TRUE(pool.is_cached(x0));
  ASSERT_TRUE(pool.reserve(big, 2, nullptr));  // z0
  EXPECT_FALSE(pool.is_cached(z0));
  EXPECT_TRUE(pool.is_cached(x0));
  pool.check({&big});
  KvBlockTable ty, tz, tx;
  EXPECT_EQ(pool.attach_prefix(ty, py), 0);  // evicted blocks no longer hit
  EXPECT_EQ(pool.attach_prefix(tz, pz), 0);
  EXPECT_EQ(pool.attach_prefix(tx, px), 2);
  EXPECT_EQ(pool.evictable_blocks(), 0);
  EXPECT_FALSE(pool.reserve(big, 2, nullptr));  // x0 is held now: nothing left to evict
  pool.check({&big, &ty, &tz, &tx});
}

TEST(KvBlockPoolLru, EvictsAChainTailBeforeItsHead) {
  KvBlockPool pool(4, 2);
  const auto p = iota_tokens(7, 1);  // 3 full blocks + 1
  KvBlockTable a = compute(pool, p);
  const std::vector<int32_t> chain(a.blocks.begin(), a.blocks.begin() + 3);
  pool.release(a);
  KvBlockTable other;
  ASSERT_TRUE(pool.reserve(other, 4, nullptr));  // the free block, then the chain's last block
  EXPECT_FALSE(pool.is_cached(chain[2]));
  EXPECT_TRUE(pool.is_cached(chain[1]));
  EXPECT_TRUE(pool.is_cached(chain[0]));
  KvBlockTable b;
  EXPECT_EQ(pool.attach_prefix(b, p), 4);  // the head of the chain still serves
  pool.check({&other, &b});
}

TEST(KvBlockPoolCow, ForkThenWriteCopiesTheSharedPartlyFilledBlock) {
  KvBlockPool pool(8, 4);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6};
  KvBlockTable a = compute(pool, prompt);
  KvBlockTable b = pool.fork(a);
  EXPECT_EQ(b.blocks, a.blocks);
  const int32_t shared = a.blocks[1];
  EXPECT_EQ(pool.ref_count(shared), 2);
  EXPECT_EQ(pool.ref_count(a.blocks[0]), 3);  // a, b, cache
  std::vector<KvBlockCopy> copies;
  expect_error([&] { pool.reserve(b, 1, nullptr); }, "no copy list");
  ASSERT_TRUE(pool.reserve(b, 1, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, shared);
  EXPECT_EQ(copies[0].dst, b.blocks[1]);
  EXPECT_EQ(copies[0].n_tokens, 2);
  EXPECT_NE(b.blocks[1], shared);
  EXPECT_EQ(b.blocks[0], a.blocks[0]);  // a full shared block is never copied
  EXPECT_EQ(pool.ref_count(shared), 1);
  copies.clear();
  ASSERT_TRUE(pool.reserve(a, 1, &copies));  // a's block is private now
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(a.blocks[1], shared);
  pool.check({&a, &b});

  KvBlockTable c = compute(pool, {9, 9, 9, 9, 9, 9, 9, 9});  // forked at a block boundary
  KvBlockTable d = pool.fork(c);
  ASSERT_TRUE(pool.reserve(d, 1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(d.blocks.size(), 3u);
  EXPECT_EQ(d.blocks[1], c.blocks[1]);
  pool.check({&a, &b, &c, &d});
  for (KvBlockTable* t : {&a, &b, &c, &d}) pool.release(*t);
  EXPECT_EQ(pool.free_blocks() + pool.evictable_blocks(), 8);
  pool.check({});
}

TEST(KvBlockPoolPrefix, IndependentlyComputedEqualPrefixIsCachedOnce) {
  KvBlockPool pool(16, 2);
  const std::vector<int32_t> p = {1, 2, 3, 4, 5};
  KvBlockTable a, b;  // both start before either has cached anything
  EXPECT_EQ(pool.attach_prefix(a, p), 0);
  EXPECT_EQ(pool.attach_prefix(b, p), 0);
  ASSERT_TRUE(pool.reserve(a, 5, nullptr));
  ASSERT_TRUE(pool.reserve(b, 5, nullptr));
  pool.cache_full_blocks(a, p);
  pool.cache_full_blocks(b, p);
  EXPECT_EQ(pool.cached_blocks(), 2);
  EXPECT_FALSE(pool.is_cached(b.blocks[0]));
  EXPECT_FALSE(pool.is_cached(b.blocks[1]));
  pool.check({&a, &b});
  // b goes on: its next full block chains onto a's cached prefix.
  const std::vector<int32_t> pb = {1, 2, 3, 4, 5, 6, 7};
  ASSERT_TRUE(pool.reserve(b, 2, nullptr));
  pool.cache_full_blocks(b, pb);
  EXPECT_TRUE(pool.is_cached(b.blocks[2]));
  EXPECT_EQ(pool.cached_blocks(), 3);
  pool.release(b);  // b's uncached duplicates become free
  KvBlockTable c;
  EXPECT_EQ(pool.attach_prefix(c, concat(pb, {8})), 6);
  EXPECT_EQ(c.blocks[0], a.blocks[0]);
  EXPECT_EQ(c.blocks[1], a.blocks[1]);
  pool.check({&a, &c});
  pool.release(a);
  pool.release(c);
  EXPECT_EQ(pool.free_blocks() + pool.evictable_blocks(), 16);
  pool.check({});
}

TEST(KvBlockPool, RejectsBadArguments) {
  expect_error([] { KvBlockPool p(4, 0); }, "block_size");
  expect_error([] { KvBlockPool p(-1, 4); }, "n_blocks");
  KvBlockPool pool(4, 4);
  KvBlockTable t;
  expect_error([&] { pool.reserve(t, -1, nullptr); }, "n_more");
  expect_error([&] { pool.blocks_needed(t, -2); }, "n_more");
  ASSERT_TRUE(pool.reserve(t, 6, nullptr));
  expect_error([&] { pool.cache_full_blocks(t, {1, 2, 3}); }, "3 tokens given for a table of 6");
  expect_error([&] { pool.attach_prefix(t, {1, 2, 3, 4, 5}); }, "already holds");
  KvBlockTable bad;
  bad.n_tokens = 5;
  expect_error([&] { pool.reserve(bad, 1, nullptr); }, "0 blocks for 5 tokens");
  expect_error([&] { pool.ref_count(4); }, "no block 4");
  KvBlockPool empty(0, 4);
  KvBlockTable u;
  EXPECT_FALSE(empty.reserve(u, 1, nullptr));
  empty.check({&u});
}

TEST(KvBlockPool, CheckNamesTheFirstBreach) {
  KvBlockPool pool(4, 4);
  KvBlockTable t;
  ASSERT_TRUE(pool.reserve(t, 5, nullptr));
  pool.check({&t});
  expect_error([&] { pool.check({}); }, "references but tables and cache hold 0");
  KvBlockTable wrong = t;
  wrong.n_tokens = 9;
  expect_error([&] { pool.check({&wrong}); }, "holds 2 blocks for 9 tokens");
  pool.release(t);
  EXPECT_EQ(pool.free_blocks(), 4);
  pool.check({});
}

}  // namespace
