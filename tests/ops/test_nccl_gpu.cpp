// The NCCL communicator (parallel/nccl_group.h) as a group of one on one GPU: NCCL loads, the
// group initializes from nccl_unique_id(), all_reduce_sum leaves the buffer as it is, and
// all_gather_cols copies the rank's columns into place; barrier returns; broadcast_bytes keeps rank
// 0's bytes (of any size, empty too). (Several ranks need
// several GPUs; the sharding math itself is checked over CPU ranks in test_tensor_parallel.cpp.)
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "cuda_test_util.h"
#include "parallel/nccl_group.h"

using namespace nf4flash;

TEST(GpuNccl, GroupOfOneOnOneGpu) {
  NF4FLASH_REQUIRE_CUDA();
  std::vector<uint8_t> id;
  try {
    id = nccl_unique_id();
  } catch (const Error& e) {
    const std::string m = e.what();
    if (m.find("cannot load NCCL") != std::string::npos) GTEST_SKIP() << "NCCL is not installed here: " << m;
    throw;
  }
  auto be = make_cuda_backend({DType::F32, 0, false, std::nullopt});
  auto comm = make_nccl_communicator(*be, 0, 1, id);
  EXPECT_EQ(comm->world(), 1);
  std::vector<float> h(15);
  for (size_t i = 0; i < h.size(); ++i) h[i] = 0.5f * float(i) - 3.0f;
  auto a = be->alloc(h.size() * 4), b = be->alloc(h.size() * 4);
  be->upload(a->data(), h.data(), h.size() * 4);
  comm->all_reduce_sum(a->as_act(DType::F32, 3, 5));
  comm->all_gather_cols(a->as_act(DType::F32, 3, 5), b->as_act(DType::F32, 3, 5));
  comm->barrier();
  std::vector<float> ra(h.size()), rb(h.size());
  be->download(ra.data(), a->data(), ra.size() * 4);
  be->download(rb.data(), b->data(), rb.size() * 4);
  EXPECT_EQ(ra, h);
  EXPECT_EQ(rb, h);
  for (size_t n : {size_t(0), size_t(3), size_t(4097)}) {
    std::vector<uint8_t> bytes(n), sent;
    for (size_t i = 0; i < n; ++i) bytes[i] = uint8_t(i * 7 + 1);
    sent = bytes;
    comm->broadcast_bytes(bytes);
    EXPECT_EQ(bytes, sent) << n << " bytes";
  }
}
