// KvBlockPool: the paged KV cache's host-side bookkeeping (see block_pool.h for the contract).
//
// Every block has a reference count (one per table holding it, plus one while it is cached).
// Blocks with no reference sit on a free stack; cached blocks that only the cache holds sit on an
// intrusive doubly linked LRU list, oldest first, and are evicted from its head when no free block
// is left. Allocation, release, eviction and each cache lookup are O(1) (expected, hash map).
//
// The prefix cache maps the rolling hash of a whole prefix (hash of the previous prefix mixed with
// this block's tokens) to the block. Each cached block is an entry with an id that is never
// reused, the id of the entry before it and its own tokens; a lookup accepts a block only when its
// tokens and its parent entry's id are equal to the query's, so by induction from the first block
// the whole prefix is equal: a hash collision can only cost a miss, never a wrong block. When an
// entry is evicted its children can no longer be reached (their parent id is gone) and age out.
// release puts a table's blocks on the LRU list last block first, so a chain's tail is evicted
// before its head.
#include "kv/block_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace nf4flash {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

uint64_t KvBlockPool::default_hash(uint64_t prefix_hash, const int32_t* tokens, int n) {
  // FNV-1a over the prefix hash and each 32-bit token, then the splitmix64 finalizer.
  uint64_t h = prefix_hash;
  for (int i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 0x100000001b3ull;
    h ^= h >> 29;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

KvBlockPool::KvBlockPool(int64_t n_blocks, int block_size) : block_size_(block_size) {
  NF4FLASH_CHECK(block_size > 0, "KvBlockPool: block_size must be positive, got ", block_size);
  NF4FLASH_CHECK(n_blocks >= 0, "KvBlockPool: n_blocks must not be negative, got ", n_blocks);
  NF4FLASH_CHECK(n_blocks <= std::numeric_limits<int32_t>::max(),
                 "KvBlockPool: n_blocks ", n_blocks, " does not fit 32-bit block ids");
  blocks_.resize(static_cast<size_t>(n_blocks));
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int KvBlockPool::block_size() const { return block_size_; }
int64_t KvBlockPool::n_blocks() const { return static_cast<int64_t>(blocks_.size()); }
int64_t KvBlockPool::free_blocks() const { return static_cast<int64_t>(free_.size()); }
int64_t KvBlockPool::evictable_blocks() const { return n_evictable_; }

int32_t KvBlockPool::ref_count(int32_t block) const {
  NF4FLASH_CHECK(block >= 0 && block < n_blocks(), "KvBlockPool: no block ", block);
  return blocks_[block].ref;
}

bool KvBlockPool::is_cached(int32_t block) const {
  NF4FLASH_CHECK(block >= 0 && block < n_blocks(), "KvBlockPool: no block ", block);
  return blocks_[block].cached;
}

void KvBlockPool::set_hash_for_testing(HashFn fn) {
  NF4FLASH_CHECK(fn != nullptr, "KvBlockPool: hash function is null");
  NF4FLASH_CHECK(index_.empty(), "KvBlockPool: the hash function can only change while nothing is cached (",
                 index_.size(), " blocks are)");
  hash_ = fn;
}

// ---- the LRU list of evictable blocks ------------------------------------------------------------

void KvBlockPool::lru_push_back(int32_t b) {
  Block& k = blocks_[b];
  k.lru_prev = lru_tail_;
  k.lru_next = -1;
  if (lru_tail_ >= 0) blocks_[lru_tail_].lru_next = b;
  else lru_head_ = b;
  lru_tail_ = b;
  ++n_evictable_;
}

void KvBlockPool::lru_remove(int32_t b) {
  Block& k = blocks_[b];
  if (k.lru_prev >= 0) blocks_[k.lru_prev].lru_next = k.lru_next;
  else lru_head_ = k.lru_next;
  if (k.lru_next >= 0) blocks_[k.lru_next].lru_prev = k.lru_prev;
  else lru_tail_ = k.lru_prev;
  k.lru_prev = k.lru_next = -1;
  --n_evictable_;
}

// ---- the prefix cache ------------------------------------------------------------------------

void KvBlockPool::uncache(int32_t b) {
  Block& k = blocks_[b];
  auto [lo, hi] = index_.equal_range(k.hash);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == b) {
      index_.erase(it);
      break;
    }
  }
  k.cached = false;
  k.serial = k.parent = k.hash = 0;
  --k.ref;  // the cache's reference
}

int32_t KvBlockPool::find_cached(uint64_t hash, uint64_t parent, const int32_t* tokens) const {
  auto [lo, hi] = index_.equal_range(hash);
  for (auto it = lo; it != hi; ++it) {
    const Block& k = blocks_[it->second];
    if (k.parent == parent &&
        std::memcmp(k.tokens.data(), tokens, sizeof(int32_t) * static_cast<size_t>(block_size_)) == 0)
      return it->second;
  }
  return -1;
}

bool KvBlockPool::settled(int32_t b, uint64_t* serial, uint64_t* hash) const {
  const Block& k = blocks_[b];
  if (k.cached) {
    *serial = k.serial;
    *hash = k.hash;
    return true;
  }
  if (k.dup >= 0 && blocks_[k.dup].cached && blocks_[k.dup].serial == k.dup_serial) {
    *serial = k.dup_serial;
    *hash = blocks_[k.dup].hash;
    return true;
  }
  return false;
}

// ---- allocation ------------------------------------------------------------------------------

int32_t KvBlockPool::alloc_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    NF4FLASH_CHECK(lru_head_ >= 0, "KvBlockPool: no block to allocate (internal: reserve counted wrong)");
    b = lru_head_;
    lru_remove(b);
    uncache(b);
  }
  Block& k = blocks_[b];
  k.ref = 1;
  k.dup = -1;
  return b;
}

void KvBlockPool::unref(int32_t b) {
  Block& k = blocks_[b];
  --k.ref;
  if (k.ref == 1 && k.cached) {
    lru_push_back(b);
  } else if (k.ref == 0) {
    k.dup = -1;
    free_.push_back(b);
  }
}

void KvBlockPool::check_table(const KvBlockTable& t, const char* what, bool every_block) const {
  NF4FLASH_CHECK(t.n_tokens >= 0, "KvBlockPool::", what, ": table has negative n_tokens ", t.n_tokens);
  const int64_t want = ceil_div(t.n_tokens, block_size_);
  NF4FLASH_CHECK(static_cast<int64_t>(t.blocks.size()) == want, "KvBlockPool::", what, ": table holds ",
                 t.blocks.size(), " blocks for ", t.n_tokens, " tokens (", want, " expected)");
  if (!every_block) {  // O(1): the last block only (the one reserve may copy)
    if (!t.blocks.empty()) {
      const int32_t b = t.blocks.back();
      NF4FLASH_CHECK(b >= 0 && b < n_blocks() && blocks_[b].ref > (blocks_[b].cached ? 1 : 0),
                     "KvBlockPool::", what, ": table names block ", b, ", which it cannot hold");
    }
    return;
  }
  for (int32_t b : t.blocks)
    NF4FLASH_CHECK(b >= 0 && b < n_blocks() && blocks_[b].ref > (blocks_[b].cached ? 1 : 0),
                   "KvBlockPool::", what, ": table names block ", b, ", which it cannot hold");
}

int64_t KvBlockPool::blocks_needed(const KvBlockTable& t, int64_t n_more) const {
  NF4FLASH_CHECK(n_more >= 0, "KvBlockPool::blocks_needed: n_more must not be negative, got ", n_more);
  if (n_more == 0) return 0;
  const int64_t have = static_cast<int64_t>(t.blocks.size());
  int64_t need = std::max<int64_t>(0, ceil_div(t.n_tokens + n_more, block_size_) - have);
  if (t.n_tokens % block_size_ != 0 && have > 0) {
    const int32_t b = t.blocks.back();
    NF4FLASH_CHECK(b >= 0 && b < n_blocks(), "KvBlockPool::blocks_needed: table names block ", b,
                   " outside the pool");
    const Block& last = blocks_[b];
    if (last.ref - (last.cached ? 1 : 0) > 1) ++need;  // copy-on-write of the shared last block
  }
  return need;
}

// ---- the public operations ---------------------------------------------------------------------

int64_t KvBlockPool::attach_prefix(KvBlockTable& t, const std::vector<int32_t>& tokens) {
  NF4FLASH_CHECK(t.blocks.empty() && t.n_tokens == 0, "KvBlockPool::attach_prefix: the table already holds ",
                 t.blocks.size(), " blocks (", t.n_tokens, " tokens); attach starts a sequence");
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t max_blocks = n > 0 ? (n - 1) / block_size_ : 0;
  uint64_t h = kPrefixSeed, parent = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    const int32_t* toks = tokens.data() + i * block_size_;
    h = hash_(h, toks, block_size_);
    const int32_t b = find_cached(h, parent, toks);
    if (b < 0) break;
    t.blocks.push_back(b);
    parent = blocks_[b].serial;
  }
  for (int32_t b : t.blocks) {
    if (blocks_[b].ref == 1) lru_remove(b);  // only the cache held it: no longer evictable
    ++blocks_[b].ref;
  }
  t.n_tokens = static_cast<int64_t>(t.blocks.size()) * block_size_;
  return t.n_tokens;
}

bool KvBlockPool::reserve(KvBlockTable& t, int64_t n_more, std::vector<KvBlockCopy>* copies) {
  NF4FLASH_CHECK(n_more >= 0, "KvBlockPool::reserve: n_more must not be negative, got ", n_more);
  check_table(t, "reserve", false);
  const int64_t need = blocks_needed(t, n_more);
  if (need > available_blocks()) return false;
  if (n_more == 0) return true;
  const int in_last = static_cast<int>(t.n_tokens % block_size_);
  if (in_last != 0) {
    const int32_t last = t.blocks.back();
    if (blocks_[last].ref - (blocks_[last].cached ? 1 : 0) > 1) {
      NF4FLASH_CHECK(copies != nullptr, "KvBlockPool::reserve: block ", last,
                     " is shared and partly filled but no copy list was given");
      const int32_t dst = alloc_block();
      copies->push_back(KvBlockCopy{last, dst, in_last});
      unref(last);  // others still hold it: never freed here
      t.blocks.back() = dst;
    }
  }
  const int64_t total = ceil_div(t.n_tokens + n_more, block_size_);
  while (static_cast<int64_t>(t.blocks.size()) < total) t.blocks.push_back(alloc_block());
  t.n_tokens += n_more;
  return true;
}

void KvBlockPool::cache_full_blocks(const KvBlockTable& t, const std::vector<int32_t>& tokens) {
  check_table(t, "cache_full_blocks", false);
  NF4FLASH_CHECK(static_cast<int64_t>(tokens.size()) >= t.n_tokens, "KvBlockPool::cache_full_blocks: ",
                 tokens.size(), " tokens given for a table of ", t.n_tokens);
  const int64_t full = t.n_tokens / block_size_;
  // Walk back to the last block whose prefix is already cached; continue the chain from there.
  int64_t start = full;
  uint64_t parent = 0, h = kPrefixSeed;
  while (start > 0 && !settled(t.blocks[start - 1], &parent, &h)) --start;
  for (int64_t i = start; i < full; ++i) {
    const int32_t b = t.blocks[i];
    const int32_t* toks = tokens.data() + i * block_size_;
    h = hash_(h, toks, block_size_);
    const int32_t e = find_cached(h, parent, toks);
    Block& k = blocks_[b];
    if (e >= 0) {  // computed independently by another sequence: keep that entry, leave b out
      k.dup = e;
      k.dup_serial = blocks_[e].serial;
      parent = k.dup_serial;
      continue;
    }
    k.cached = true;
    ++k.ref;
    k.hash = h;
    k.serial = next_serial_++;
    k.parent = parent;
    k.tokens.assign(toks, toks + block_size_);
    k.dup = -1;
    index_.emplace(h, b);
    parent = k.serial;
  }
}

KvBlockTable KvBlockPool::fork(const KvBlockTable& t) {
  check_table(t, "fork", true);
  for (int32_t b : t.blocks) ++blocks_[b].ref;
  return t;
}

void KvBlockPool::release(KvBlockTable& t) {
  check_table(t, "release", true);
  // Last block first, so that a chain's tail becomes evictable before its head.
  for (auto it = t.blocks.rbegin(); it != t.blocks.rend(); ++it) unref(*it);
  t.blocks.clear();
  t.n_tokens = 0;
}

// ---- invariants ------------------------------------------------------------------------------

void KvBlockPool::check(const std::vector<const KvBlockTable*>& live) const {
  const int64_t n = n_blocks();
  std::vector<int64_t> want(static_cast<size_t>(n), 0);
  for (size_t i = 0; i < live.size(); ++i) {
    const KvBlockTable& t = *live[i];
    NF4FLASH_CHECK(t.n_tokens >= 0 && static_cast<int64_t>(t.blocks.size()) == ceil_div(t.n_tokens, block_size_),
                   "KvBlockPool::check: table ", i, " holds ", t.blocks.size(), " blocks for ", t.n_tokens, " tokens");
    for (int32_t b : t.blocks) {
      NF4FLASH_CHECK(b >= 0 && b < n, "KvBlockPool::check: table ", i, " names block ", b, " outside the pool");
      ++want[b];
    }
  }
  int64_t held = 0, cached = 0, evictable = 0;
  for (int64_t b = 0; b < n; ++b) {
    const Block& k = blocks_[b];
    if (k.cached) ++want[b], ++cached;
    NF4FLASH_CHECK(k.ref == want[b], "KvBlockPool::check: block ", b, " has ", k.ref,
                   " references but tables and cache hold ", want[b]);
    if (k.ref > 0) ++held;
    if (k.cached && k.ref == 1) ++evictable;
    if (k.cached) {
      NF4FLASH_CHECK(static_cast<int64_t>(k.tokens.size()) == block_size_ && k.serial > 0 && k.serial < next_serial_,
                     "KvBlockPool::check: cached block ", b, " has no valid entry");
      NF4FLASH_CHECK(find_cached(k.hash, k.parent, k.tokens.data()) == b, "KvBlockPool::check: cached block ", b,
                     " is not found under its prefix (missing from the index, or a duplicate prefix)");
    }
  }
  NF4FLASH_CHECK(static_cast<int64_t>(index_.size()) == cached, "KvBlockPool::check: the index has ",
                 index_.size(), " entries for ", cached, " cached blocks");
  NF4FLASH_CHECK(free_blocks() + held == n, "KvBlockPool::check: ", free_blocks(), " free + ", held,
                 " held blocks != ", n, " blocks");
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (int32_t b : free_) {
    NF4FLASH_CHECK(b >= 0 && b < n && blocks_[b].ref == 0 && !seen[b],
                   "KvBlockPool::check: free list holds block ", b, " (referenced, or listed twice)");
    seen[b] = 1;
  }
  int64_t walked = 0;
  for (int32_t b = lru_head_, prev = -1; b >= 0; prev = b, b = blocks_[b].lru_next) {
    NF4FLASH_CHECK(walked < n && blocks_[b].lru_prev == prev, "KvBlockPool::check: LRU list broken at block ", b);
    NF4FLASH_CHECK(blocks_[b].cached && blocks_[b].ref == 1, "KvBlockPool::check: LRU list holds block ", b,
                   ", which is not evictable");
    ++walked;
    if (blocks_[b].lru_next < 0)
      NF4FLASH_CHECK(lru_tail_ == b, "KvBlockPool::check: LRU tail is ", lru_tail_, ", list ends at ", b);
  }
  NF4FLASH_CHECK(walked == evictable && n_evictable_ == evictable, "KvBlockPool::check: ", evictable,
                 " evictable blocks, ", walked, " on the LRU list, count says ", n_evictable_);
}

}  // namespace nf4flash
