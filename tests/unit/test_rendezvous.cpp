// The tensor-parallel rank variables (parallel/rendezvous.h): the torchrun-style variables and
// their errors; the NCCL communicator's refusal of a non-CUDA backend.
#include <gtest/gtest.h>

#include <map>

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

// The NCCL communicator joins a CUDA backend's stream: any other backend is one clear error.
TEST(Rendezvous, NcclCommunicatorNeedsACudaBackend) {
  auto cpu = make_cpu_backend({DType::F32, 1});
  const std::string m = test::error_message([&] { make_nccl_communicator(*cpu, 0, 1, std::vector<uint8_t>(128, 0)); });
  EXPECT_NE(m.find("tensor parallel over NCCL"), std::string::npos) << m;
}

}  // namespace
}  // namespace nf4flash
