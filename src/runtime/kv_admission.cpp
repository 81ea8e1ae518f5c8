// PoolAdmission: the scheduler's KvAdmission over a KvBlockPool and the live block tables.
#include "runtime/kv_admission.h"

#include "core/error.h"

namespace nf4flash {

int64_t PoolAdmission::blocks_needed(int64_t seq_id, int64_t n_more) const {
  static const KvBlockTable kEmpty;
  const KvBlockTable* t = table(seq_id);
  return pool_.blocks_needed(t ? *t : kEmpty, n_more);
}

int64_t PoolAdmission::releasable_blocks(int64_t seq_id) const {
  const KvBlockTable* t = table(seq_id);
  if (!t) return 0;
  int64_t n = 0;
  for (int32_t b : t->blocks) {
    const int32_t others = pool_.ref_count(b) - 1 - (pool_.is_cached(b) ? 1 : 0);  // other tables' references
    n += others == 0;
  }
  return n;
}

int64_t PoolAdmission::start(int64_t seq_id, const std::vector<int32_t>& prompt) {
  NF4FLASH_CHECK(!tables_.count(seq_id), "KV cache: sequence ", seq_id, " was started already");
  KvBlockTable& t = tables_[seq_id];
  return pool_.attach_prefix(t, prompt);
}

void PoolAdmission::reserve(const StepEntry& e, std::vector<KvBlockCopy>* copies) {
  KvBlockTable& t = tables_[e.seq_id];  // a sequence without a cached prefix starts here
  NF4FLASH_CHECK(t.n_tokens == e.pos0, "KV cache: sequence ", e.seq_id, " holds ", t.n_tokens,
                 " positions, the plan starts at ", e.pos0);
  NF4FLASH_CHECK(pool_.reserve(t, e.n_tokens, copies), "KV cache: no room for ", e.n_tokens, " positions of sequence ",
                 e.seq_id, " (", pool_.available_blocks(), " blocks available)");
}

void PoolAdmission::computed(int64_t seq_id, const std::vector<int32_t>& tokens) {
  const KvBlockTable* t = table(seq_id);
  NF4FLASH_CHECK(t, "KV cache: sequence ", seq_id, " has no table");
  pool_.cache_full_blocks(*t, tokens);
}

void PoolAdmission::release(int64_t seq_id) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return;
  pool_.release(it->second);
  tables_.erase(it);
}

const KvBlockTable* PoolAdmission::table(int64_t seq_id) const {
  auto it = tables_.find(seq_id);
  return it == tables_.end() ? nullptr : &it->second;
}

void PoolAdmission::check() const {
  std::vector<const KvBlockTable*> live;
  for (const auto& [id, t] : tables_) live.push_back(&t);
  pool_.check(live);
}

}  // namespace nf4flash
