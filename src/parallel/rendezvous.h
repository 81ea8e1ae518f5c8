// Where a process stands in a tensor-parallel group, torchrun-style: each reads its RANK,
// WORLD_SIZE, LOCAL_RANK (its GPU on the host), MASTER_ADDR and MASTER_PORT (where rank 0
// listens) from the environment. The ranks then connect through parallel/tcp_group.h; the same
// binary thereby spans several hosts (parallel/tp_process.h).
#pragma once
#include <functional>
#include <string>

namespace nf4flash {

struct RankEnv {
  int rank = 0, world = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// The variables read through `get` (null: unset). None set: a group of one. A malformed value, or
// a rank outside [0, WORLD_SIZE), is an error naming the variable.
RankEnv rank_env_from(const std::function<const char*(const char*)>& get);
RankEnv rank_env();  // from the process environment

}  // namespace nf4flash
