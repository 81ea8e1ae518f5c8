// Tensor-parallel sharding of the generic decoder (Megatron-style): which part of each weight a
// rank holds, and where its partial results are summed.
//
// A rank of `world` holds contiguous, balanced ranges: items [r*N/world, (r+1)*N/world) of N.
//   q heads:        a range of the n_heads (q_proj rows, o_proj columns, the attention itself);
//                   a rank may hold none when n_heads < world (it then adds zeros to the sum);
//   kv heads:       the kv heads its q heads read (k_proj/v_proj rows, its KV cache): with fewer
//                   kv heads than ranks a kv head is held, replicated, by every rank reading it;
//   intermediate:   a range of the MLP rows (gate/up rows, down columns), for every expert too;
//   vocabulary:     a range of the lm_head rows; the logits are gathered across ranks.
// Replicated: the embedding table, norms, MoE routers and the shared expert's gate. After o_proj
// and after down (or the MoE block) the ranks' partial outputs are all-reduced (summed); the
// o_proj/down biases are added by the last rank alone (it always holds heads and intermediate rows).
// Dense weights cut anywhere; 4-bit weights are quantized whole (or read pre-quantized) and cut on
// the bitsandbytes block boundaries (quant4_rows, quant4_cols in weight_loader.h), refused where a
// cut falls inside a block.
#pragma once
#include <cstdint>
#include <string>

#include "io/hf_config.h"
#include "model/arch.h"

namespace nf4flash {

class Communicator;

// This rank's place in the group; world 1 (the default) is the unsharded decoder.
struct TpShard {
  int rank = 0, world = 1;
  Communicator* comm = nullptr;  // required when world > 1
};

struct TpRange {
  int64_t begin = 0, n = 0;
  int64_t end() const { return begin + n; }
};
// Items [rank*total/world, (rank+1)*total/world).
TpRange tp_range(int64_t total, int rank, int world);
// The kv heads q heads [q.begin, q.end()) read (q head h reads h / (n_heads / n_kv_heads)).
TpRange tp_kv_heads(const ModelConfig& cfg, TpRange q_heads);

struct TpLayout {
  int rank = 0, world = 1;
  TpRange q_heads, kv_heads;   // kv_heads: empty when q_heads is
  TpRange inter;               // dense MLP rows
  TpRange expert_inter, shared_inter;  // MoE experts and Qwen2-MoE's shared expert
  TpRange vocab;               // lm_head rows
  bool sharded() const { return world > 1; }
  bool bias_rank() const { return rank == world - 1; }  // adds the o_proj/down biases
};

// The layout of `s` for this model; fails (one line naming the model and the shape) when the
// group is malformed or a rank's q heads cannot read its kv heads as one uniform GQA grouping.
// inter_unit: the MLP intermediates split in whole units of it where it divides them (the 4-bit
// blocksize, so that the down projections' column shards start and end on bitsandbytes blocks).
TpLayout tp_layout(const ModelConfig& cfg, const TpShard& s, int64_t inter_unit = 1);

}  // namespace nf4flash
