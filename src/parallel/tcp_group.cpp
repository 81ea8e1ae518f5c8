// The host-memory communicator over TCP between processes (see tcp_group.h).
#include "parallel/tcp_group.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/socket_util.h"

namespace nf4flash {

namespace {

static_assert(std::endian::native == std::endian::little, "the wire format is the host's little-endian layout");

constexpr char kMagic[] = "nf4flash-tpc";  // 12 bytes on the wire, no terminator
constexpr size_t kMagicLen = sizeof(kMagic) - 1;
enum Op : uint64_t { kAllReduce = 1, kGather = 2, kBarrier = 3, kBroadcast = 4, kError = 0xE };
constexpr size_t kChunk = size_t(1) << 18;  // elements rank 0 receives and adds at a time

const char* op_name(uint64_t op) {
  switch (op) {
    case kAllReduce: return "all_reduce_sum";
    case kGather: return "all_gather_cols";
    case kBarrier: return "barrier";
    case kBroadcast: return "broadcast_bytes";
    case kError: return "an error";
    default: return "an unknown message";
  }
}

struct Header {
  uint64_t op = 0, a = 0, b = 0, c = 0;
};

class TcpComm final : public Communicator {
 public:
  TcpComm(const RankEnv& e, double timeout_s) : rank_(e.rank), world_(e.world) {
    if (e.world < 1 || e.rank < 0 || e.rank >= e.world)
      fail("tensor parallel: rank ", e.rank, " outside a group of ", e.world);
    links_.resize(size_t(world_));
    if (world_ == 1) return;
    const auto deadline = sock::deadline_in(timeout_s);
    if (rank_ == 0) accept_ranks(e, deadline);
    else join(e, deadline);
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  Device device() const override { return Device::CPU; }  // host memory

  void all_reduce_sum(Act buf) override {
    check_f32(buf, "all_reduce_sum");
    const uint64_t n = uint64_t(buf.numel());
    float* data = static_cast<float*>(buf.data);
    run(kAllReduce, [&] {
      if (rank_ != 0) {
        send_to(0, Header{kAllReduce, n}, data, n * 4);
        if (recv_reply(kAllReduce).a != n) throw Failure{cat("rank 0 answered all_reduce_sum with another size")};
        recv_from(0, data, n * 4);
        return;
      }
      for (int r = 1; r < world_; ++r) {
        const Header h = recv_request(r, kAllReduce);
        if (h.a != n) throw Failure{cat("all_reduce_sum: rank 0 passes ", n, " elements, rank ", r, " passes ", h.a)};
      }
      if (world_ > 1) scratch_.resize(std::min<size_t>(n, kChunk));
      for (int r = 1; r < world_; ++r)  // ((b_0 + b_1) + b_2) + ..., as InProcessGroup adds
        for (uint64_t i0 = 0; i0 < n; i0 += kChunk) {
          const size_t k = size_t(std::min<uint64_t>(kChunk, n - i0));
          recv_from(r, scratch_.data(), k * 4);
          float* sum = data + i0;
          for (size_t i = 0; i < k; ++i) sum[i] += scratch_[i];
        }
      for (int r = 1; r < world_; ++r) send_to(r, Header{kAllReduce, n}, data, n * 4);
    });
  }

  void all_gather_cols(Act local, Act out) override {
    check_f32(local, "all_gather_cols");
    check_f32(out, "all_gather_cols");
    if (local.rows != out.rows) fail("all_gather_cols: the local block has ", local.rows, " rows, the output ", out.rows);
    const uint64_t rows = uint64_t(out.rows), cols = uint64_t(out.cols);
    float* o = static_cast<float*>(out.data);
    run(kGather, [&] {
      if (rank_ != 0) {
        send_to(0, Header{kGather, rows, uint64_t(local.cols), cols}, local.data, local.bytes());
        const Header h = recv_reply(kGather);
        if (h.a != rows || h.b != cols) throw Failure{cat("rank 0 answered all_gather_cols with another shape")};
        recv_from(0, o, out.bytes());
        return;
      }
      std::vector<uint64_t> c(size_t(world_), uint64_t(local.cols));
      uint64_t total = c[0];
      for (int r = 1; r < world_; ++r) {
        const Header h = recv_request(r, kGather);
        if (h.a != rows) throw Failure{cat("all_gather_cols: rank ", r, " passes ", h.a, " rows, rank 0 passes ", rows)};
        if (h.c != cols)
          throw Failure{cat("all_gather_cols: rank ", r, "'s output has ", h.c, " columns, rank 0's has ", cols)};
        c[size_t(r)] = h.b;
        total += std::min(h.b, cols + 1);  // no overflow on nonsense
      }
      if (total != cols) throw Failure{cat("all_gather_cols: the ranks pass ", total, " columns, the output has ", cols)};
      uint64_t c0 = 0;
      for (int r = 0; r < world_; ++r) {
        const size_t w = size_t(c[size_t(r)]);
        const float* block = static_cast<const float*>(local.data);
        if (r > 0) {
          scratch_.resize(rows * w);
          recv_from(r, scratch_.data(), scratch_.size() * 4);
          block = scratch_.data();
        }
        for (uint64_t i = 0; i < rows && w > 0; ++i) std::memcpy(o + i * cols + c0, block + i * w, w * 4);
        c0 += w;
      }
      for (int r = 1; r < world_; ++r) send_to(r, Header{kGather, rows, cols}, o, out.bytes());
    });
  }

  void barrier() override {
    run(kBarrier, [&] {
      if (rank_ != 0) {
        send_to(0, Header{kBarrier}, nullptr, 0);
        recv_reply(kBarrier);
        return;
      }
      for (int r = 1; r < world_; ++r) recv_request(r, kBarrier);
      for (int r = 1; r < world_; ++r) send_to(r, Header{kBarrier}, nullptr, 0);
    });
  }

  void broadcast_bytes(std::vector<uint8_t>& bytes) override {
    run(kBroadcast, [&] {
      if (rank_ != 0) {
        send_to(0, Header{kBroadcast}, nullptr, 0);
        bytes.resize(size_t(recv_reply(kBroadcast).a));
        recv_from(0, bytes.data(), bytes.size());
        return;
      }
      for (int r = 1; r < world_; ++r) recv_request(r, kBroadcast);
      for (int r = 1; r < world_; ++r) send_to(r, Header{kBroadcast, bytes.size()}, bytes.data(), bytes.size());
    });
  }

  void abort() override {
    aborted_ = true;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (broken_.empty()) broken_ = cat("rank ", rank_, " aborted the group");
    }
    shutdown_links();
  }

 private:
  // What ends the group: the line every rank throws, and the rank whose link is dead (-1: none).
  struct Failure {
    std::string why;
    int dead = -1;
  };

  static void check_f32(Act a, const char* op) {
    if (a.dtype != DType::F32) fail(op, ": the TCP group reduces F32 buffers only, not ", dtype_name(a.dtype));
  }

  int fd(int r) const { return links_[size_t(r)].fd; }

  template <typename Body>
  void run(Op op, Body&& body) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!broken_.empty()) fail("tensor parallel: ", broken_);
    }
    op_ = op_name(op);
    try {
      body();
    } catch (const Failure& f) {
      break_group(f);
    }
  }

  // Records the failure, tells the other ranks (rank 0, best effort), shuts every link down, throws.
  [[noreturn]] void break_group(const Failure& f) {
    std::string why = aborted_ ? cat("rank ", rank_, " aborted the group") : f.why;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (broken_.empty()) broken_ = why;
      why = broken_;
    }
    if (rank_ == 0 && !aborted_) {
      std::vector<uint8_t> frame(sizeof(Header) + why.size());
      const Header h{kError, why.size()};
      std::memcpy(frame.data(), &h, sizeof h);
      std::memcpy(frame.data() + sizeof h, why.data(), why.size());
      for (int r = 1; r < world_; ++r)
        if (r != f.dead) (void)::send(fd(r), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    shutdown_links();
    fail("tensor parallel: ", why);
  }

  void shutdown_links() {
    for (const sock::Fd& l : links_)
      if (l.fd >= 0) ::shutdown(l.fd, SHUT_RDWR);
  }

  Failure failure(int r, const sock::LinkDown& d) {
    if (d.incoming) return incoming(r);
    if (d.why.empty()) return Failure{cat("rank ", r, " closed its connection during ", op_), r};
    return Failure{cat("the connection to rank ", r, " failed during ", op_, ": ", d.why), r};
  }

  // A send to rank r stopped because r has something to say: its end closed, rank 0's error
  // message, or data out of turn (the ranks call different collectives).
  Failure incoming(int r) {
    uint8_t b = 0;
    const ssize_t k = ::recv(fd(r), &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k <= 0) return failure(r, sock::LinkDown{k == 0 ? "" : sock::errno_text(errno)});
    if (rank_ != 0) {
      try {
        recv_reply(kError);
      } catch (const Failure& f) {
        return f;
      }
    }
    return Failure{cat("rank ", r, " sent data out of turn during ", op_, " (the ranks call different collectives)")};
  }

  void send_to(int r, const Header& h, const void* payload, size_t n) {
    try {
      sock::send_all(fd(r), &h, sizeof h, n > 0);
      if (n > 0) sock::send_all(fd(r), payload, n);
    } catch (const sock::LinkDown& d) {
      throw failure(r, d);
    }
  }

  void recv_from(int r, void* p, size_t n) {
    try {
      sock::recv_all(fd(r), p, n);
    } catch (const sock::LinkDown& d) {
      throw failure(r, d);
    }
  }

  // Rank 0: rank r's header, which must open the same collective.
  Header recv_request(int r, Op op) {
    Header h;
    recv_from(r, &h, sizeof h);
    if (h.op != op)
      throw Failure{cat("rank ", r, " called ", op_name(h.op), " while rank 0 called ", op_name(op),
                        " (the ranks must call the same collectives in the same order)")};
    return h;
  }

  // Other ranks: rank 0's answer, or the error message it sends instead.
  Header recv_reply(Op op) {
    Header h;
    recv_from(0, &h, sizeof h);
    if (h.op == kError) {
      std::string why(size_t(std::min<uint64_t>(h.a, 1 << 16)), '\0');
      recv_from(0, why.data(), why.size());
      throw Failure{why};
    }
    if (h.op != op) throw Failure{cat("rank 0 sent ", op_name(h.op), " during ", op_)};
    return h;
  }

  void accept_ranks(const RankEnv& e, sock::Clock::time_point deadline) {
    sock::Fd listener(sock::listen_any(e.master_port, world_));
    if (listener.fd < 0)
      fail("tensor parallel: rank 0 cannot listen on port ", e.master_port, " (MASTER_PORT): ", std::strerror(errno));
    int joined = 0, dropped = 0;
    while (joined < world_ - 1) {
      const double left = std::min(sock::seconds_left(deadline), 1e6);
      pollfd pfd{listener.fd, POLLIN, 0};
      const int pr = left > 0 ? ::poll(&pfd, 1, int(left * 1000) + 1) : 0;
      if (pr < 0 && errno == EINTR) continue;
      if (pr <= 0) {
        std::string missing;
        for (int r = 1; r < world_; ++r)
          if (fd(r) < 0) missing += cat(missing.empty() ? "" : ", ", r);
        fail("tensor parallel: rank 0 heard from ", joined, " of the ", world_ - 1, " other ranks on port ",
             e.master_port, " before the timeout (missing ranks ", missing, ")",
             dropped ? cat("; dropped ", dropped, " connections that did not greet as a rank") : std::string());
      }
      sock::Fd c(::accept(listener.fd, nullptr, nullptr));
      if (c.fd < 0) continue;
      char magic[kMagicLen];
      int32_t hello[2] = {-1, 0};  // rank, world
      try {
        sock::io_all(c.fd, magic, kMagicLen, false, deadline, "greeting");
        sock::io_all(c.fd, hello, sizeof hello, false, deadline, "greeting");
      } catch (const Error&) {
        ++dropped;  // not one of ours, or it went away: keep waiting for the ranks
        continue;
      }
      if (std::memcmp(magic, kMagic, kMagicLen) != 0) {
        ++dropped;
        continue;
      }
      const int r = hello[0];
      if (r <= 0 || r >= world_)
        fail("tensor parallel: a process connected to rank 0 as rank ", r, ", outside the ranks 1..", world_ - 1,
             " of a group of ", world_, " (RANK / WORLD_SIZE of the processes differ)");
      if (hello[1] != world_)
        fail("tensor parallel: rank ", r, " has WORLD_SIZE=", hello[1], ", rank 0 has ", world_);
      if (fd(r) >= 0)
        fail("tensor parallel: rank ", r, " connected to rank 0 twice (two processes have RANK=", r, ")");
      links_[size_t(r)] = std::move(c);
      ++joined;
    }
    for (int r = 1; r < world_; ++r) {  // the group is complete: tell every rank
      const int32_t w = world_;
      const std::string what = cat("tensor parallel: rank 0 answering rank ", r);
      sock::io_all(fd(r), const_cast<char*>(kMagic), kMagicLen, true, deadline, what);
      sock::io_all(fd(r), const_cast<int32_t*>(&w), 4, true, deadline, what);
      sock::no_delay(fd(r));
    }
  }

  void join(const RankEnv& e, sock::Clock::time_point deadline) {
    const std::string where = cat(e.master_addr, ":", e.master_port);
    sockaddr_in addr{};
    if (!sock::resolve_ipv4(e.master_addr, e.master_port, &addr))
      fail("tensor parallel: MASTER_ADDR '", e.master_addr, "' does not resolve");
    std::string last = "no attempt";
    while (sock::seconds_left(deadline) > 0) {  // rank 0 may not listen yet
      sock::Fd c(sock::connect_before(addr, deadline, &last));
      if (c.fd < 0) {
        const double left = sock::seconds_left(deadline);
        if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.02)));
        continue;
      }
      const std::string what = cat("tensor parallel: rank ", rank_, " joining the group of rank 0 at ", where);
      const int32_t hello[2] = {rank_, world_};
      char magic[kMagicLen];
      int32_t w = 0;
      try {
        sock::io_all(c.fd, const_cast<char*>(kMagic), kMagicLen, true, deadline, what);
        sock::io_all(c.fd, const_cast<int32_t*>(hello), sizeof hello, true, deadline, what);
        sock::io_all(c.fd, magic, kMagicLen, false, deadline, what);
        sock::io_all(c.fd, &w, 4, false, deadline, what);
      } catch (const Error& err) {
        fail(err.what(), " (rank 0 closes the connections when it rejects a rank or fails: see its error)");
      }
      if (std::memcmp(magic, kMagic, kMagicLen) != 0 || w != world_)
        fail(what, ": the answer is not that of a group of ", world_);
      sock::no_delay(c.fd);
      links_[0] = std::move(c);
      return;
    }
    fail("tensor parallel: rank ", rank_, " could not reach rank 0 at ", where,
         " (MASTER_ADDR:MASTER_PORT) before the timeout: ", last);
  }

  int rank_, world_;
  std::vector<sock::Fd> links_;  // rank 0: links_[r] to rank r; other ranks: links_[0] to rank 0
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::string broken_;      // why the group ended ("" while it works)
  const char* op_ = "";     // the collective in progress
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<Communicator> make_tcp_communicator(const RankEnv& e, double timeout_s) {
  return std::make_unique<TcpComm>(e, timeout_s);
}

}  // namespace nf4flash
