// How the processes of one tensor-parallel group find each other, torchrun-style: each reads its
// RANK, WORLD_SIZE, LOCAL_RANK (its GPU on the host), MASTER_ADDR and MASTER_PORT from the
// environment; rank 0 listens on MASTER_PORT and hands every other rank the group's id (NCCL's
// unique id, opaque bytes here) over TCP. The same binary thereby spans several hosts.
//
// Wire format, per connection: the rank sends "nf4flash-tp" (11 bytes) and its rank (int32,
// little-endian); rank 0 answers with the id's length (uint32) and the id.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

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

// Rank 0: serves `id` to the other world - 1 ranks, each once, and returns it once all have it.
// Other ranks: connect to MASTER_ADDR:MASTER_PORT (retrying while rank 0 starts) and return the
// id it sends. Waits at most timeout_s; errors name the address, the rank and what failed.
std::vector<uint8_t> exchange_group_id(const RankEnv& e, const std::vector<uint8_t>& id, double timeout_s);

}  // namespace nf4flash
