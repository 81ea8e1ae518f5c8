// The communicator over TCP (parallel/tcp_group.h), its ranks run as threads of this process on
// 127.0.0.1: the same bits as InProcessGroup, gathers of uneven column counts, broadcasts, many
// collectives in a row; a rank that aborts or goes away, a rank 0 nobody runs, a stranger or a
// duplicate rank on the port each end in an error within a bounded time, never a hang.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "core/error.h"
#include "parallel/communicator.h"
#include "parallel/socket_util.h"
#include "parallel/tcp_group.h"
#include "rank_test_util.h"
#include "test_util.h"

namespace nf4flash {
namespace {

using Clock = std::chrono::steady_clock;

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port() {
  const int port = sock::free_loopback_port();
  EXPECT_GT(port, 0);
  return port;
}

RankEnv env(int rank, int world, int port) {
  RankEnv e;
  e.rank = rank;
  e.world = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// fn(rank, comm) on one thread per rank, each with its own TCP communicator; the ranks' failures
// in rank order ("" for none). A rank whose fn throws aborts its communicator, as callers must.
std::vector<std::string> on_ranks(int world, const std::function<void(int, Communicator&)>& fn) {
  const int port = free_port();
  std::vector<std::string> errs(static_cast<size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      std::unique_ptr<Communicator> c;
      try {
        c = make_tcp_communicator(env(r, world, port), 10.0);
        fn(r, *c);
      } catch (const std::exception& e) {
        errs[size_t(r)] = e.what();
        if (c) c->abort();
      }
    });
  for (auto& t : ts) t.join();
  return errs;
}


std::vector<float> random_floats(std::mt19937& rng, size_t n) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng) * std::pow(10.0f, float(int(rng() % 9) - 4));  // magnitudes 1e-4..1e4
  return v;
}

// Every size (0, odd, more than a socket buffer holds) at 2 and 4 ranks: the same bits as the
// in-process group's rank-order sum on every rank.
TEST(TcpGroup, AllReduceMatchesInProcessGroupBitForBit) {
  const std::vector<int64_t> sizes = {0, 1, 7, 1001, 65537, 300001};
  for (int world : {2, 4}) {
    std::mt19937 rng(static_cast<uint32_t>(world));
    std::vector<std::vector<std::vector<float>>> in(sizes.size());  // [size][rank]
    for (size_t s = 0; s < sizes.size(); ++s)
      for (int r = 0; r < world; ++r) in[s].push_back(random_floats(rng, size_t(sizes[s])));
    auto want = in, got = in;
    InProcessGroup g(world);
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r)
      ts.emplace_back([&, r] {
        for (size_t s = 0; s < sizes.size(); ++s) g.comm(r).all_reduce_sum(f32_act(want[s][size_t(r)], 1, sizes[s]));
      });
    for (auto& t : ts) t.join();
    expect_no_errors(on_ranks(world, [&](int r, Communicator& c) {
      EXPECT_EQ(c.device(), Device::CPU);
      EXPECT_EQ(c.world(), world);
      EXPECT_EQ(c.rank(), r);
      for (size_t s = 0; s < sizes.size(); ++s) c.all_reduce_sum(f32_act(got[s][size_t(r)], 1, sizes[s]));
    }));
    for (size_t s = 0; s < sizes.size(); ++s)
      for (int r = 0; r < world; ++r)
        ASSERT_EQ(std::memcmp(got[s][size_t(r)].data(), want[s][0].data(), size_t(sizes[s]) * 4), 0)
            << "world " << world << " size " << sizes[s] << " rank " << r;
  }
}

TEST(TcpGroup, AllGatherColsPutsUnevenBlocksSideBySide) {
  const int W = 4, rows = 3;
  const int cols[W] = {2, 0, 5, 1};
  std::vector<std::vector<float>> out(W, std::vector<float>(rows * 8, -1.0f));
  expect_no_errors(on_ranks(W, [&](int r, Communicator& c) {
    std::vector<float> mine(size_t(rows * cols[r]));
    for (int i = 0; i < rows; ++i)
      for (int k = 0; k < cols[r]; ++k) mine[size_t(i * cols[r] + k)] = float(100 * r + 10 * i + k);
    c.all_gather_cols(f32_act(mine, rows, cols[r]), f32_act(out[size_t(r)], rows, 8));
  }));
  const std::vector<float> want = {0,  1,  200, 201, 202, 203, 204, 300,  //
                                   10, 11, 210, 211, 212, 213, 214, 310,  //
                                   20, 21, 220, 221, 222, 223, 224, 320};
  for (int r = 0; r < W; ++r) EXPECT_EQ(out[size_t(r)], want) << "rank " << r;
}

TEST(TcpGroup, BroadcastBytesEmptyAndLarge) {
  std::vector<uint8_t> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 131 + (i >> 9));
  std::vector<std::vector<uint8_t>> got(3);
  std::vector<size_t> empty_sizes(3, 99);
  expect_no_errors(on_ranks(3, [&](int r, Communicator& c) {
    std::vector<uint8_t> b = r == 0 ? std::vector<uint8_t>{} : std::vector<uint8_t>(17, 5);  // overwritten
    c.broadcast_bytes(b);
    empty_sizes[size_t(r)] = b.size();
    got[size_t(r)] = r == 0 ? big : std::vector<uint8_t>(3, 1);
    c.broadcast_bytes(got[size_t(r)]);
  }));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(empty_sizes[size_t(r)], 0u) << "rank " << r;
    EXPECT_TRUE(got[size_t(r)] == big) << "rank " << r;
  }
}

TEST(TcpGroup, BarrierWaitsForEveryRank) {
  const int W = 3;
  std::atomic<int> entered{0};
  std::vector<int> seen(W, -1);
  expect_no_errors(on_ranks(W, [&](int r, Communicator& c) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40 * r));  // rank 2 comes last
    ++entered;
    c.barrier();
    seen[size_t(r)] = entered.load();
  }));
  for (int r = 0; r < W; ++r) EXPECT_EQ(seen[size_t(r)], W) << "rank " << r;
}

// Hundreds of small collectives of changing sizes back to back: the framing never slips.
TEST(TcpGroup, ManyCollectivesInARow) {
  const int W = 3;
  std::vector<std::string> failures(W);
  expect_no_errors(on_ranks(W, [&](int r, Communicator& c) {
    for (int it = 0; it < 200; ++it) {
      const int n = 1 + it % 13;
      std::vector<float> v(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) v[size_t(i)] = float(r * 1000 + it + i);
      c.all_reduce_sum(f32_act(v, 1, n));
      for (int i = 0; i < n; ++i)
        if (v[size_t(i)] != float(3 * (it + i) + 3000)) failures[size_t(r)] = cat("iteration ", it, " element ", i);
      if (it % 10 == 0) c.barrier();
      if (it % 25 == 0) {
        std::vector<uint8_t> b = r == 0 ? std::vector<uint8_t>(size_t(it), uint8_t(it)) : std::vector<uint8_t>{};
        c.broadcast_bytes(b);
        if (b != std::vector<uint8_t>(size_t(it), uint8_t(it))) failures[size_t(r)] = cat("broadcast ", it);
      }
    }
  }));
  for (int r = 0; r < W; ++r) EXPECT_EQ(failures[size_t(r)], "") << "rank " << r;
}

// A rank that aborts after a few collectives, one that goes away (its communicator destroyed, as
// when its process exits), and a rank 0 that aborts: the others throw, naming who, in bounded time.
TEST(TcpGroup, APeerThatAbortsOrLeavesEndsTheOthersCollectives) {
  for (int quitter : {1, 2, 0}) {
    const bool destroy = quitter == 2;
    const int W = 3, port = free_port();
    std::vector<std::string> errs(W), later(W);
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int r = 0; r < W; ++r)
      ts.emplace_back([&, r] {
        auto c = make_tcp_communicator(env(r, W, port), 10.0);
        std::vector<float> v(1 << 20, 1.0f);  // 4 MB: more than the sockets buffer
        try {
          for (int it = 0; it < 3; ++it) c->all_reduce_sum(f32_act(v, 1, int64_t(v.size())));
          if (r == quitter) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others wait in a collective
            if (destroy) return;  // c closes its connections
            c->abort();
          }
          std::vector<uint8_t> b(r == 0 ? 3 << 20 : 0);
          c->broadcast_bytes(b);
          c->all_reduce_sum(f32_act(v, 1, int64_t(v.size())));
        } catch (const Error& e) {
          errs[size_t(r)] = e.what();
        }
        later[size_t(r)] = test::error_message([&] { c->barrier(); });
      });
    for (auto& t : ts) t.join();
    EXPECT_LT(seconds_since(t0), 5.0) << "quitter " << quitter;
    const std::string who = cat("rank ", quitter);
    for (int r = 0; r < W; ++r) {
      if (r == quitter && destroy) continue;
      EXPECT_NE(errs[size_t(r)].find("tensor parallel: " + who), std::string::npos) << "rank " << r << ": " << errs[size_t(r)];
      EXPECT_EQ(later[size_t(r)], errs[size_t(r)]) << "rank " << r;  // later collectives throw the same
    }
    if (quitter != 0) {
      EXPECT_NE(errs[0].find(who + " closed its connection during broadcast_bytes"), std::string::npos) << errs[0];
    }
    if (!destroy) {
      EXPECT_EQ(errs[size_t(quitter)], "tensor parallel: " + who + " aborted the group");
    }
  }
}

// abort() from another thread while its rank waits in a collective (rank 2 is late): that rank's
// own call and the other ranks' calls (rank 1 blocked sending 4 MB) throw instead of waiting on.
TEST(TcpGroup, AbortWakesBlockedCallsOnEveryRank) {
  for (int aborter : {0, 1}) {
    const int W = 3, port = free_port();
    std::vector<std::string> errs(W);
    const auto t0 = Clock::now();
    std::vector<std::thread> ts;
    for (int r = 0; r < W; ++r)
      ts.emplace_back([&, r] {
        auto c = make_tcp_communicator(env(r, W, port), 10.0);
        std::vector<float> v(1 << 20, 1.0f);
        std::thread watchdog([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          if (r == aborter) c->abort();
        });
        if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        errs[size_t(r)] = test::error_message([&] { c->all_reduce_sum(f32_act(v, 1, int64_t(v.size()))); });
        watchdog.join();
      });
    for (auto& t : ts) t.join();
    EXPECT_LT(seconds_since(t0), 5.0) << "aborter " << aborter;
    const std::string who = cat("tensor parallel: rank ", aborter);
    EXPECT_EQ(errs[size_t(aborter)], who + " aborted the group");
    for (int r = 0; r < W; ++r) {
      if (r == aborter) continue;
      EXPECT_EQ(errs[size_t(r)], who + " closed its connection during all_reduce_sum") << "aborter " << aborter << " rank " << r;
    }
  }
}

TEST(TcpGroup, MismatchedCallsFailOnEveryRank) {
  auto errs = on_ranks(3, [&](int r, Communicator& c) {
    std::vector<float> v(size_t(4 + 2 * (r == 2)));
    c.all_reduce_sum(f32_act(v, 1, int64_t(v.size())));
  });
  for (const auto& e : errs)
    EXPECT_NE(e.find("all_reduce_sum: rank 0 passes 4 elements, rank 2 passes 6"), std::string::npos) << e;
  errs = on_ranks(2, [&](int r, Communicator& c) {
    std::vector<float> v(1 << 20);  // rank 1's large buffer waits unread: rank 0's error still reaches it
    if (r == 0) c.barrier();
    else c.all_reduce_sum(f32_act(v, 1, int64_t(v.size())));
  });
  for (const auto& e : errs)
    EXPECT_NE(e.find("rank 1 called all_reduce_sum while rank 0 called barrier"), std::string::npos) << e;
  errs = on_ranks(2, [&](int r, Communicator& c) {
    std::vector<float> local(4), out(size_t(r == 0 ? 8 : 6));
    c.all_gather_cols(f32_act(local, 2, 2), f32_act(out, 2, r == 0 ? 4 : 3));
  });
  for (const auto& e : errs) EXPECT_NE(e.find("all_gather_cols: rank 1's output has 3 columns"), std::string::npos) << e;
  errs = on_ranks(1, [&](int, Communicator& c) {
    uint16_t h[2] = {};
    c.all_reduce_sum(Act{h, DType::BF16, 1, 2});
  });
  EXPECT_NE(errs[0].find("F32 buffers only, not BF16"), std::string::npos) << errs[0];
}

TEST(TcpGroup, UnreachableRankZeroFailsWithinTheTimeout) {
  const int port = free_port();
  const auto t0 = Clock::now();
  const std::string m = test::error_message([&] { make_tcp_communicator(env(1, 2, port), 0.4); });
  EXPECT_NE(m.find(cat("rank 1 could not reach rank 0 at 127.0.0.1:", port)), std::string::npos) << m;
  EXPECT_LT(seconds_since(t0), 3.0);
  const std::string alone = test::error_message([&] { make_tcp_communicator(env(0, 3, port), 0.3); });
  EXPECT_NE(alone.find("rank 0 heard from 0 of the 2 other ranks"), std::string::npos) << alone;
  EXPECT_NE(alone.find("missing ranks 1, 2"), std::string::npos) << alone;
  EXPECT_EQ(make_tcp_communicator(env(0, 1, port), 0.1)->world(), 1);  // a group of one needs nobody
}

// A raw connection to rank 0's port that greets with `magic`, rank and world; returns the fd.
int greet(int port, const char* magic, int32_t rank, int32_t world) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(uint16_t(port));
  int fd = -1;
  for (int i = 0; i < 200; ++i) {  // rank 0 may not listen yet
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
    ::close(fd);
    fd = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(fd, 0);
  const int32_t hello[2] = {rank, world};
  EXPECT_EQ(::send(fd, magic, 12, MSG_NOSIGNAL), 12);
  EXPECT_EQ(::send(fd, hello, 8, MSG_NOSIGNAL), 8);
  return fd;
}

// Rank 0 closes a stranger's connection and still forms the group with the real ranks.
TEST(TcpGroup, RankZeroDropsAStrangersConnection) {
  const int port = free_port();
  std::string err0, err1;
  std::vector<float> v0 = {1.5f}, v1 = {2.0f};
  std::thread t0([&] {
    err0 = test::error_message([&] { make_tcp_communicator(env(0, 2, port), 5.0)->all_reduce_sum(f32_act(v0, 1, 1)); });
  });
  const int stranger = greet(port, "nf4flash-tp\x01", 1, 2);
  char b = 0;
  EXPECT_EQ(::recv(stranger, &b, 1, 0), 0);  // closed by rank 0
  ::close(stranger);
  err1 = test::error_message([&] { make_tcp_communicator(env(1, 2, port), 5.0)->all_reduce_sum(f32_act(v1, 1, 1)); });
  t0.join();
  EXPECT_EQ(err0, "");
  EXPECT_EQ(err1, "");
  EXPECT_EQ(v0[0], 3.5f);
  EXPECT_EQ(v1[0], 3.5f);
}

TEST(TcpGroup, RankZeroRejectsDuplicateAndOutOfRangeRanks) {
  struct Case {
    int32_t first, second, world;
    const char* error;
  };
  const Case cases[] = {{1, 1, 3, "rank 1 connected to rank 0 twice"},
                        {1, 3, 3, "as rank 3, outside the ranks 1..2 of a group of 3"},
                        {1, 2, 4, "rank 2 has WORLD_SIZE=4, rank 0 has 3"}};
  for (const Case& k : cases) {
    const int port = free_port();
    std::string err0;
    std::thread t0([&] { err0 = test::error_message([&] { make_tcp_communicator(env(0, 3, port), 5.0); }); });
    const int a = greet(port, "nf4flash-tpc", k.first, 3);
    const int b = greet(port, "nf4flash-tpc", k.second, k.world);
    t0.join();
    EXPECT_NE(err0.find(k.error), std::string::npos) << err0;
    char x = 0;
    EXPECT_LE(::recv(a, &x, 1, 0), 0);  // rank 0 gave up: the connections are closed
    ::close(a);
    ::close(b);
  }
  // a real rank turned away learns it from its handshake, naming rank 0's address
  const int port = free_port();
  std::string err0;
  std::thread t0([&] { err0 = test::error_message([&] { make_tcp_communicator(env(0, 3, port), 5.0); }); });
  const int a = greet(port, "nf4flash-tpc", 2, 3);
  const std::string m = test::error_message([&] { make_tcp_communicator(env(2, 3, port), 5.0); });
  t0.join();
  ::close(a);
  EXPECT_NE(err0.find("rank 2 connected to rank 0 twice"), std::string::npos) << err0;
  EXPECT_NE(m.find(cat("rank 2 joining the group of rank 0 at 127.0.0.1:", port)), std::string::npos) << m;
}

}  // namespace
}  // namespace nf4flash
