// The paged KV cache's bookkeeping on the host: a pool of fixed-size blocks (block_size token
// positions each, every layer's K and V of those positions), a block table per sequence, and the
// prefix cache that shares full blocks between sequences whose token prefixes are equal.
// The backend holds the blocks' memory; this code decides which block holds which positions.
//
// Blocks are reference-counted: a sequence's table holds one reference on each of its blocks;
// the prefix cache holds one on each cached block. A block with no reference is free. A full block
// is cached under the hash of the whole token prefix up to its end (so equal hashes mean equal
// prefixes, compared token by token to rule out collisions); a cached block that only the cache
// holds is evictable, least recently used first, when the pool runs out.
#pragma once
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace nf4flash {

// A copy the backend must do before the step that writes the destination: block `src`'s
// positions [0, n_tokens) into block `dst` (copy-on-write of a shared, partly filled block).
struct KvBlockCopy {
  int32_t src = -1, dst = -1;
  int n_tokens = 0;
};

// One sequence's blocks: position p lives in blocks[p / block_size] at slot p % block_size.
struct KvBlockTable {
  std::vector<int32_t> blocks;
  int64_t n_tokens = 0;  // positions written (or about to be, after reserve)
};

class KvBlockPool {
 public:
  KvBlockPool(int64_t n_blocks, int block_size);

  int block_size() const;
  int64_t n_blocks() const;
  int64_t free_blocks() const;       // blocks with no reference
  int64_t evictable_blocks() const;  // cached blocks only the cache holds
  int64_t available_blocks() const { return free_blocks() + evictable_blocks(); }
  // Blocks a table needs to hold n more positions (0 when its last block has room), counting the
  // private copy of a shared, partly filled last block: reserve(t, n_more) succeeds exactly when
  // this is at most available_blocks().
  int64_t blocks_needed(const KvBlockTable& t, int64_t n_more) const;

  // Start a sequence on `tokens` (its prompt): the longest prefix of whole blocks found in the
  // prefix cache is shared (those positions need no prefill), returning how many tokens are
  // cached (a multiple of block_size, at most tokens.size() - 1 so that the last prompt token is
  // always computed). The table holds references on the shared blocks; it must start empty.
  int64_t attach_prefix(KvBlockTable& t, const std::vector<int32_t>& tokens);
  // Make room for n more positions at the end of t: allocates blocks (evicting LRU cached ones
  // when none is free) and, where the last block is shared with another holder and partly filled,
  // replaces it by a private copy (the copy is appended to `copies`, which may be null only when
  // no copy is needed). false when the pool cannot provide the blocks: nothing changes then.
  bool reserve(KvBlockTable& t, int64_t n_more, std::vector<KvBlockCopy>* copies);
  // After positions up to t.n_tokens have been computed for `tokens` (the sequence's tokens so
  // far, at least t.n_tokens of them): every full block not yet cached is entered in the prefix
  // cache under its prefix.
  void cache_full_blocks(const KvBlockTable& t, const std::vector<int32_t>& tokens);
  // A second table sharing all of t's blocks (n samples of one prompt); writes into a shared
  // partly filled last block go through reserve's copy-on-write.
  KvBlockTable fork(const KvBlockTable& t);
  // Drop the table's references (blocks no one else holds become free, or stay cached).
  void release(KvBlockTable& t);

  // Invariant check for tests: reference counts equal the references tables and cache hold
  // (given every live table), and free + held == n_blocks. Throws Error naming the first breach.
  void check(const std::vector<const KvBlockTable*>& live) const;

  // For tests and diagnostics: a block's references (tables + cache) and whether it is cached.
  int32_t ref_count(int32_t block) const;
  bool is_cached(int32_t block) const;
  int64_t cached_blocks() const { return static_cast<int64_t>(index_.size()); }

  // The rolling hash: the hash of a prefix through one more block of n tokens, from the hash of
  // the prefix before it (kPrefixSeed for the first block). Tests replace it (only while nothing is
  // cached) by a weak one to force collisions; lookups compare tokens, so hashes only route.
  using HashFn = uint64_t (*)(uint64_t prefix_hash, const int32_t* tokens, int n);
  static constexpr uint64_t kPrefixSeed = 0xcbf29ce484222325ull;
  static uint64_t default_hash(uint64_t prefix_hash, const int32_t* tokens, int n);
  void set_hash_for_testing(HashFn fn);

 private:
  struct Block {
    int32_t ref = 0;                   // table references + 1 while cached
    bool cached = false;
    int32_t lru_prev = -1, lru_next = -1;  // links while evictable (cached, ref == 1)
    uint64_t hash = 0;                 // rolling hash of the prefix through this block (cached)
    uint64_t serial = 0;               // the cache entry's id, never reused (cached)
    uint64_t parent = 0;               // the entry id of the prefix before this block (0: none)
    std::vector<int32_t> tokens;       // this block's tokens (cached)
    // A full, uncached block whose prefix is already cached in another block (`dup` while that
    // block still holds entry `dup_serial`): cache_full_blocks continues the chain from there.
    int32_t dup = -1;
    uint64_t dup_serial = 0;
  };

  int32_t alloc_block();               // a free block, else the least recently used evictable one
  void unref(int32_t b);               // drop one table reference
  void lru_push_back(int32_t b);
  void lru_remove(int32_t b);
  void uncache(int32_t b);
  // The cached block holding exactly the prefix (entry `parent`, then these tokens), or -1.
  int32_t find_cached(uint64_t hash, uint64_t parent, const int32_t* tokens) const;
  // The entry id and hash of the cached prefix through block b of a table, when it is known.
  bool settled(int32_t b, uint64_t* serial, uint64_t* hash) const;
  // Throws unless t's block count matches its n_tokens and its blocks (all, or the last) are held.
  void check_table(const KvBlockTable& t, const char* what, bool every_block) const;

  int block_size_ = 0;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;          // blocks with no reference (a stack)
  int32_t lru_head_ = -1, lru_tail_ = -1;  // evictable blocks, oldest first
  int64_t n_evictable_ = 0;
  std::unordered_multimap<uint64_t, int32_t> index_;  // prefix hash -> cached block
  uint64_t next_serial_ = 1;
  HashFn hash_ = &default_hash;
};

}  // namespace nf4flash
