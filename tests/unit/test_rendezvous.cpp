// The tensor-parallel rendezvous (parallel/rendezvous.h): the torchrun-style variables and their
// errors; ranks started before rank 0 still get its id over 127.0.0.1; a rank that cannot reach
// rank 0, and a rank 0 that hears from too few ranks, fail within the timeout naming why.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "core/error.h"
#include "parallel/nccl_group.h"
#include "parallel/rendezvous.h"
#include "test_util.h"

namespace nf4flash {
namespace {

RankEnv env_of(const std::map<std::string, std::string>& vars) {
  return rank_env_from([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(Rendezvous, ReadsTheVariables) {
  const RankEnv none = env_of({});
  EXPECT_EQ(none.world, 1);
  EXPECT_EQ(none.rank, 0);
  const RankEnv e = env_of({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.7"}, {"MASTER_PORT", "29600"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 29600);
  EXPECT_NE(test::error_message([] { env_of({{"WORLD_SIZE", "0"}}); }).find("WORLD_SIZE='0'"), std::string::npos);
  EXPECT_NE(test::error_message([] { env_of({{"RANK", "x"}}); }).find("RANK='x'"), std::string::npos);
  EXPECT_NE(test::error_message([] { env_of({{"MASTER_PORT", "70000"}}); }).find("MASTER_PORT"), std::string::npos);
  EXPECT_NE(test::error_message([] { env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}); }).find("RANK=2 is outside WORLD_SIZE=2"),
            std::string::npos);
  EXPECT_NE(test::error_message([] { env_of({{"MASTER_ADDR", ""}}); }).find("MASTER_ADDR is empty"), std::string::npos);
}

TEST(Rendezvous, EveryRankGetsRankZerosId) {
  const int port = free_port();
  const std::vector<uint8_t> id = {1, 2, 3, 250, 0, 7};
  constexpr int kWorld = 3;
  std::vector<std::vector<uint8_t>> got(kWorld);
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> ts;
  for (int r = kWorld - 1; r >= 0; --r) {  // the other ranks first: they retry until rank 0 listens
    ts.emplace_back([&, r] {
      if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(150));
      RankEnv e;
      e.rank = r;
      e.world = kWorld;
      e.master_port = port;
      try {
        got[size_t(r)] = exchange_group_id(e, r == 0 ? id : std::vector<uint8_t>{}, 10.0);
      } catch (const Error& err) {
        errors[size_t(r)] = err.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(got[size_t(r)], id) << "rank " << r;
  }
}

TEST(Rendezvous, TimeoutsNameWhatIsMissing) {
  RankEnv e;
  e.world = 2;
  e.rank = 1;
  e.master_port = free_port();
  const auto t0 = std::chrono::steady_clock::now();
  const std::string lost = test::error_message([&] { exchange_group_id(e, {}, 0.3); });
  EXPECT_NE(lost.find("rank 1 could not reach rank 0 at 127.0.0.1:"), std::string::npos) << lost;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  e.rank = 0;
  const std::string alone = test::error_message([&] { exchange_group_id(e, {9}, 0.3); });
  EXPECT_NE(alone.find("rank 0 heard from 0 of the 1 other ranks"), std::string::npos) << alone;
  e.world = 1;  // a group of one needs nobody
  EXPECT_EQ(exchange_group_id(e, {5}, 0.1), std::vector<uint8_t>{5});
}

// The NCCL communicator joins a CUDA backend's stream: any other backend is one clear error.
TEST(Rendezvous, NcclCommunicatorNeedsACudaBackend) {
  auto cpu = make_cpu_backend({DType::F32, 1});
  const std::string m = test::error_message([&] { make_nccl_communicator(*cpu, 0, 1, std::vector<uint8_t>(128, 0)); });
  EXPECT_NE(m.find("tensor parallel over NCCL"), std::string::npos) << m;
}

}  // namespace
}  // namespace nf4flash
