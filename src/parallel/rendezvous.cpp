#include "parallel/rendezvous.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace nf4flash {

namespace {

int parse_int(const char* name, const char* v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (!*v || *end || errno || x < lo || x > hi) fail(name, "='", v, "': expected an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}

}  // namespace

RankEnv rank_env_from(const std::function<const char*(const char*)>& get) {
  RankEnv e;
  if (const char* v = get("WORLD_SIZE")) e.world = parse_int("WORLD_SIZE", v, 1, 4096);
  if (const char* v = get("RANK")) e.rank = parse_int("RANK", v, 0, 4095);
  if (const char* v = get("LOCAL_RANK")) e.local_rank = parse_int("LOCAL_RANK", v, 0, 1023);
  if (const char* v = get("MASTER_ADDR")) {
    if (!*v) fail("MASTER_ADDR is empty");
    e.master_addr = v;
  }
  if (const char* v = get("MASTER_PORT")) e.master_port = parse_int("MASTER_PORT", v, 1, 65535);
  if (e.rank >= e.world) fail("RANK=", e.rank, " is outside WORLD_SIZE=", e.world, " (ranks are 0..", e.world - 1, ")");
  return e;
}

RankEnv rank_env() {
  return rank_env_from([](const char* name) { return std::getenv(name); });
}

}  // namespace nf4flash
