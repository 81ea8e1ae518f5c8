// The scheduler's view of the paged KV cache (KvAdmission, runtime/scheduler.h) over a real
// KvBlockPool (kv/block_pool.h) and the block tables of the live sequences, and the sequence-level
// operations the engine runs around a step: start a sequence (attach its cached prefix), reserve a
// plan's positions, release a finished or preempted sequence. Answers are exact: blocks_needed
// counts a copy-on-write block, so a plan the scheduler makes can always be reserved.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kv/block_pool.h"
#include "runtime/scheduler.h"

namespace nf4flash {

class PoolAdmission : public KvAdmission {
 public:
  explicit PoolAdmission(KvBlockPool& pool) : pool_(pool) {}

  int64_t blocks_needed(int64_t seq_id, int64_t n_more) const override;
  // Blocks that become free or evictable when seq_id's table is released: those this table alone
  // holds (a cached one stays in the prefix cache, evictable).
  int64_t releasable_blocks(int64_t seq_id) const override;
  int64_t available_blocks() const override { return pool_.available_blocks(); }
  int64_t total_blocks() const override { return pool_.n_blocks(); }
  int block_size() const override { return pool_.block_size(); }

  // A new sequence: its table holds the longest cached run of whole blocks of `prompt`; returns the
  // cached tokens (SchedRequest::cached_len). Error if seq_id already has a table.
  int64_t start(int64_t seq_id, const std::vector<int32_t>& prompt);
  // The positions of one plan entry; copies needed first are appended. Error when the pool cannot
  // provide them (the scheduler's plan promised they fit).
  void reserve(const StepEntry& e, std::vector<KvBlockCopy>* copies);
  // After positions up to the table's end are computed for `tokens`: full blocks enter the cache.
  void computed(int64_t seq_id, const std::vector<int32_t>& tokens);
  // Drops the sequence's table (finished or preempted); no-op when it has none.
  void release(int64_t seq_id);

  const KvBlockTable* table(int64_t seq_id) const;
  size_t n_tables() const { return tables_.size(); }
  // KvBlockPool::check over every live table.
  void check() const;

 private:
  KvBlockPool& pool_;
  std::unordered_map<int64_t, KvBlockTable> tables_;
};

}  // namespace nf4flash
