// The in-process communicator of tensor parallelism: the all-reduce's rank order (the same bits on
// every rank whatever the threads' timing), gathers of uneven column counts, and a failing or
// mismatched rank ending every rank's collective with an error instead of a hang.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "parallel/communicator.h"
#include "rank_test_util.h"

using namespace nf4flash;

namespace {

// fn(rank) on one thread per rank; the failures of the ranks, in rank order ("" for none). A rank
// that throws aborts the group, as a caller of the communicator must.
std::vector<std::string> on_ranks(InProcessGroup& g, const std::function<void(int)>& fn) {
  std::vector<std::string> errs(size_t(g.world()));
  std::vector<std::thread> ts;
  for (int r = 0; r < g.world(); ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errs[size_t(r)] = e.what();
        g.comm(r).abort();
      }
    });
  for (auto& t : ts) t.join();
  return errs;
}


// 1e8 + 1 rounds back to 1e8 in f32, so the order of the additions shows in the result:
// ((1e8 + 1) - 1e8) + 1 = 1, while e.g. ((1e8 - 1e8) + 1) + 1 = 2.
TEST(Communicator, AllReduceSumsInRankOrderOnEveryRank) {
  const float vals[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  InProcessGroup g(4);
  std::mt19937 rng(7);
  for (int iter = 0; iter < 30; ++iter) {
    std::vector<int> delay_us(4);
    for (auto& d : delay_us) d = int(rng() % 300);
    std::vector<std::vector<float>> bufs(4);
    expect_no_errors(on_ranks(g, [&](int r) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay_us[size_t(r)]));  // arrivals in any order
      bufs[size_t(r)].assign(5, vals[r]);
      g.comm(r).all_reduce_sum(f32_act(bufs[size_t(r)], 1, 5));
    }));
    for (int r = 0; r < 4; ++r)
      for (float v : bufs[size_t(r)]) ASSERT_EQ(v, 1.0f) << "rank " << r << " iteration " << iter;
  }
}

// Many elements of random magnitude: every rank ends with the rank-order sum, bit for bit.
TEST(Communicator, AllReduceEqualsSerialRankOrderSum) {
  const int W = 3, n = 1001;  // the ranks' shares of the summing differ in size
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<std::vector<float>> in(W, std::vector<float>(n));
  for (auto& v : in)
    for (auto& x : v) x = u(rng) * std::pow(10.0f, float(int(rng() % 9) - 4));
  std::vector<float> want(n);
  for (int i = 0; i < n; ++i) want[size_t(i)] = (in[0][size_t(i)] + in[1][size_t(i)]) + in[2][size_t(i)];
  InProcessGroup g(W);
  std::vector<std::vector<float>> bufs = in;
  expect_no_errors(on_ranks(g, [&](int r) {
    g.comm(r).all_reduce_sum(f32_act(bufs[size_t(r)], 7, 143));
    g.comm(r).barrier();
  }));
  for (int r = 0; r < W; ++r) EXPECT_EQ(std::memcmp(bufs[size_t(r)].data(), want.data(), n * 4), 0) << "rank " << r;
  // a second reduction of the sums: each element times W, in the same order
  expect_no_errors(on_ranks(g, [&](int r) { g.comm(r).all_reduce_sum(f32_act(bufs[size_t(r)], 1, n)); }));
  for (int i = 0; i < n; ++i) ASSERT_EQ(bufs[1][size_t(i)], (want[size_t(i)] + want[size_t(i)]) + want[size_t(i)]);
}

TEST(Communicator, AllGatherColsPutsRanksSideBySide) {
  const int W = 3, rows = 2;
  const int cols[W] = {1, 3, 2};
  InProcessGroup g(W);
  std::vector<std::vector<float>> out(W, std::vector<float>(rows * 6, -1.0f));
  expect_no_errors(on_ranks(g, [&](int r) {
    std::vector<float> mine(size_t(rows * cols[r]));
    for (int i = 0; i < rows; ++i)
      for (int c = 0; c < cols[r]; ++c) mine[size_t(i * cols[r] + c)] = float(100 * r + 10 * i + c);
    g.comm(r).all_gather_cols(f32_act(mine, rows, cols[r]), f32_act(out[size_t(r)], rows, 6));
  }));
  const std::vector<float> want = {0, 100, 101, 102, 200, 201,  //
                                   10, 110, 111, 112, 210, 211};
  for (int r = 0; r < W; ++r) EXPECT_EQ(out[size_t(r)], want) << "rank " << r;
}

TEST(Communicator, MismatchedCollectiveFailsOnEveryRank) {
  InProcessGroup g(2);
  std::vector<std::vector<float>> bufs = {std::vector<float>(4), std::vector<float>(6)};
  const auto errs = on_ranks(g, [&](int r) { g.comm(r).all_reduce_sum(f32_act(bufs[size_t(r)], 1, 4 + 2 * r)); });
  for (const auto& e : errs) EXPECT_NE(e.find("all_reduce_sum: ranks pass"), std::string::npos) << e;
}

TEST(Communicator, FailingRankReleasesTheOthers) {
  InProcessGroup g(3);
  const auto errs = on_ranks(g, [&](int r) {
    if (r == 1) throw Error("rank 1 could not load its shard");
    std::vector<float> mine(8);
    g.comm(r).all_reduce_sum(f32_act(mine, 1, 8));  // would wait for rank 1 forever
  });
  EXPECT_EQ(errs[1], "rank 1 could not load its shard");
  EXPECT_NE(errs[0].find("rank 1 aborted the group"), std::string::npos) << errs[0];
  EXPECT_NE(errs[2].find("rank 1 aborted the group"), std::string::npos) << errs[2];
}

}  // namespace
