#include "parallel/rendezvous.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "core/error.h"
#include "parallel/socket_util.h"

namespace nf4flash {

namespace {

constexpr char kMagic[] = "nf4flash-tp";  // 11 bytes on the wire, no terminator
constexpr size_t kMagicLen = sizeof(kMagic) - 1;
using sock::Clock;
using sock::Fd;
using sock::io_all;
using sock::seconds_left;

int parse_int(const char* name, const char* v, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (!*v || *end || errno || x < lo || x > hi) fail(name, "='", v, "': expected an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}

std::string where(const RankEnv& e) { return cat(e.master_addr, ":", e.master_port); }

std::vector<uint8_t> serve_id(const RankEnv& e, const std::vector<uint8_t>& id, Clock::time_point deadline) {
  Fd s(sock::listen_any(e.master_port, e.world));
  if (s.fd < 0)
    fail("tensor parallel rendezvous: rank 0 cannot listen on port ", e.master_port, " (MASTER_PORT): ", std::strerror(errno));
  std::set<int> served;
  while (int(served.size()) < e.world - 1) {
    const double left = seconds_left(deadline);
    pollfd pfd{s.fd, POLLIN, 0};
    const int pr = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0)
      fail("tensor parallel rendezvous: rank 0 heard from ", served.size(), " of the ", e.world - 1,
           " other ranks on port ", e.master_port, " before the timeout");
    Fd c(::accept(s.fd, nullptr, nullptr));
    if (c.fd < 0) continue;
    char magic[kMagicLen];
    int32_t rank = -1;
    try {
      io_all(c.fd, magic, kMagicLen, false, deadline, "tensor parallel rendezvous: reading a rank's greeting");
      io_all(c.fd, &rank, 4, false, deadline, "tensor parallel rendezvous: reading a rank's number");
    } catch (const Error&) {
      continue;  // not one of ours (a port scanner, a dead peer): keep waiting for the ranks
    }
    if (std::memcmp(magic, kMagic, kMagicLen) != 0) continue;
    if (rank <= 0 || rank >= e.world || served.count(rank))
      fail("tensor parallel rendezvous: rank ", rank, " connected to rank 0 ",
           rank <= 0 || rank >= e.world ? cat("outside the world of ", e.world) : std::string("twice"),
           " (RANK / WORLD_SIZE of the processes differ)");
    const uint32_t n = static_cast<uint32_t>(id.size());
    io_all(c.fd, const_cast<uint32_t*>(&n), 4, true, deadline, cat("tensor parallel rendezvous: sending the id to rank ", rank));
    io_all(c.fd, const_cast<uint8_t*>(id.data()), id.size(), true, deadline,
           cat("tensor parallel rendezvous: sending the id to rank ", rank));
    served.insert(rank);
  }
  return id;
}

std::vector<uint8_t> fetch_id(const RankEnv& e, Clock::time_point deadline) {
  sockaddr_in addr{};
  if (!sock::resolve_ipv4(e.master_addr, e.master_port, &addr))
    fail("tensor parallel rendezvous: MASTER_ADDR '", e.master_addr, "' does not resolve");
  std::string last = "no attempt";
  while (seconds_left(deadline) > 0) {  // rank 0 may not listen yet
    Fd c(::socket(AF_INET, SOCK_STREAM, 0));
    if (c.fd < 0) fail("tensor parallel rendezvous: socket: ", std::strerror(errno));
    if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      last = std::strerror(errno);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    const std::string what = cat("tensor parallel rendezvous: rank ", e.rank, " with rank 0 at ", where(e));
    const int32_t rank = e.rank;
    io_all(c.fd, const_cast<char*>(kMagic), kMagicLen, true, deadline, what);
    io_all(c.fd, const_cast<int32_t*>(&rank), 4, true, deadline, what);
    uint32_t n = 0;
    io_all(c.fd, &n, 4, false, deadline, what);
    if (n > (1u << 20)) fail(what, ": an id of ", n, " bytes is not one of ours");
    std::vector<uint8_t> id(n);
    io_all(c.fd, id.data(), n, false, deadline, what);
    return id;
  }
  fail("tensor parallel rendezvous: rank ", e.rank, " could not reach rank 0 at ", where(e),
       " (MASTER_ADDR:MASTER_PORT) before the timeout: ", last);
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

std::vector<uint8_t> exchange_group_id(const RankEnv& e, const std::vector<uint8_t>& id, double timeout_s) {
  if (e.world == 1) return id;
  const auto deadline = sock::deadline_in(timeout_s);
  return e.rank == 0 ? serve_id(e, id, deadline) : fetch_id(e, deadline);
}

}  // namespace nf4flash
