// The tensor-parallel layout of a model over a group of ranks (see tp_layout.h).
#include "model/tp_layout.h"

#include "core/error.h"
#include "parallel/communicator.h"

namespace nf4flash {

TpRange tp_range(int64_t total, int rank, int world) {
  const int64_t b = total * rank / world, e = total * (rank + 1) / world;
  return {b, e - b};
}

TpRange tp_kv_heads(const ModelConfig& cfg, TpRange q_heads) {
  if (q_heads.n == 0) return {};
  const int64_t group = cfg.n_heads / cfg.n_kv_heads, h0 = q_heads.begin, h1 = q_heads.end();
  return {h0 / group, (h1 - 1) / group - h0 / group + 1};
}

TpLayout tp_layout(const ModelConfig& cfg, const TpShard& s, int64_t inter_unit) {
  if (s.world < 1 || s.rank < 0 || s.rank >= s.world)
    fail("tensor parallel: rank ", s.rank, " in a group of ", s.world);
  if (s.world > 1) {
    if (!s.comm) fail("tensor parallel: rank ", s.rank, " of ", s.world, " has no communicator");
    if (s.comm->world() != s.world || s.comm->rank() != s.rank)
      fail("tensor parallel: rank ", s.rank, " of ", s.world, " was given the communicator of rank ", s.comm->rank(),
           " of ", s.comm->world());
  }
  TpLayout l;
  l.rank = s.rank;
  l.world = s.world;
  const int nh = cfg.n_heads, nkv = cfg.n_kv_heads, group = nh / nkv;
  l.q_heads = tp_range(nh, s.rank, s.world);
  if (l.q_heads.n > 0) {
    // the kv heads of q heads [h0, h1): h / group for each; the backend reads local kv head
    // j / (n_q / n_kv) for local q head j, which must name the same head
    const int64_t h0 = l.q_heads.begin, h1 = l.q_heads.end();
    l.kv_heads = tp_kv_heads(cfg, l.q_heads);
    const int64_t nq = l.q_heads.n, nk = l.kv_heads.n;
    bool uniform = nq % nk == 0;
    for (int64_t j = 0; uniform && j < nq; ++j) uniform = (h0 + j) / group - l.kv_heads.begin == j / (nq / nk);
    if (!uniform)
      fail(cfg.source, ": tensor parallel over ", s.world, " ranks: rank ", s.rank, "'s q heads ", h0, "..", h1 - 1,
           " do not read its kv heads ", l.kv_heads.begin, "..", l.kv_heads.end() - 1,
           " as one uniform grouping (num_attention_heads ", nh, ", num_key_value_heads ", nkv, ")");
  }
  auto split = [&](int64_t total, const char* what, int64_t unit = 1) {
    if (unit < 1 || total % unit != 0) unit = 1;
    TpRange r = tp_range(total / unit, s.rank, s.world);
    r = {r.begin * unit, r.n * unit};
    if (total > 0 && r.n == 0)
      fail(cfg.source, ": tensor parallel over ", s.world, " ranks: ", what, " ", total, " is smaller than the group");
    return r;
  };
  l.inter = split(cfg.intermediate_size, "intermediate_size", inter_unit);
  l.expert_inter = split(cfg.moe.expert_intermediate, "the experts' intermediate size", inter_unit);
  l.shared_inter = split(cfg.moe.shared_intermediate, "the shared expert's intermediate size", inter_unit);
  l.vocab = split(cfg.vocab_size, "vocab_size");
  return l;
}

}  // namespace nf4flash
