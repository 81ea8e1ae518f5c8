// Small TCP helpers of the group over sockets (parallel/tcp_group.cpp): an owning descriptor, deadlines, exact-length reads and writes
// bounded by a deadline or without one, IPv4 name resolution, listening and connecting sockets.
// Internal to parallel/.
#pragma once
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"

namespace nf4flash::sock {

using Clock = std::chrono::steady_clock;

// Closes the descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) ::close(fd);
      fd = o.fd;
      o.fd = -1;
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

inline Clock::time_point deadline_in(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

inline double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Reads or writes exactly n bytes before the deadline; errors start with `what`.
inline void io_all(int fd, void* buf, size_t n, bool write, Clock::time_point deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const double left = seconds_left(deadline);
    if (left <= 0) fail(what, ": timed out");
    pollfd pfd{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int pr = ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) fail(what, ": timed out");
    const ssize_t r = write ? ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : ::recv(fd, p, n, MSG_DONTWAIT);
    if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (r <= 0) fail(what, ": ", r == 0 ? "the connection closed" : std::strerror(errno));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

// host:port as an IPv4 address; false when the name does not resolve.
inline bool resolve_ipv4(const std::string& host, int port, sockaddr_in* out) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  const std::string service = std::to_string(port);
  if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || !res) return false;
  *out = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
  ::freeaddrinfo(res);
  return true;
}

// A socket listening on every interface at `port` (SO_REUSEADDR); -1 with errno set on failure.
inline int listen_any(int port, int backlog) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, backlog) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// A TCP port on 127.0.0.1 that was free a moment ago (its socket closed again); -1 with errno set
// on failure.
inline int free_loopback_port() {
  Fd s(::socket(AF_INET, SOCK_STREAM, 0));
  if (s.fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  return ntohs(a.sin_port);
}

// What send_all / recv_all throw: why is "" when the other end closed (or reset) the connection,
// else the errno text; incoming: send_all stopped because the other end has data for us or has
// closed its end.
struct LinkDown {
  std::string why;
  bool incoming = false;
};

inline std::string errno_text(int err) { return err == EPIPE || err == ECONNRESET ? "" : std::strerror(err); }

// Sends n bytes, waiting without a timeout, but stops (LinkDown, incoming) once the other end has
// data for us or has closed its end: for protocols in which nobody sends to a side that is still
// sending, so that this means an error or a closed end, never a wait for a reader that is gone.
// more: the next send continues the message (MSG_MORE).
inline void send_all(int fd, const void* buf, size_t n, bool more = false) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    pollfd pfd{fd, POLLOUT | POLLIN, 0};
    if (::poll(&pfd, 1, -1) < 0) {
      if (errno == EINTR) continue;
      throw LinkDown{std::strerror(errno)};
    }
    if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) throw LinkDown{"", true};
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0));
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      throw LinkDown{errno_text(errno)};
    }
    p += r;
    n -= size_t(r);
  }
}

// Receives exactly n bytes, waiting without a timeout (a shutdown of the socket ends the wait).
inline void recv_all(int fd, void* buf, size_t n) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) throw LinkDown{""};
    if (r < 0) throw LinkDown{errno_text(errno)};
    p += r;
    n -= size_t(r);
  }
}

// One connection attempt to addr, bounded by the deadline: the connected (blocking) descriptor,
// or -1 with `last` set to why.
inline int connect_before(const sockaddr_in& addr, Clock::time_point deadline, std::string* last) {
  Fd c(::socket(AF_INET, SOCK_STREAM, 0));
  if (c.fd < 0) fail("socket: ", std::strerror(errno));
  const int flags = ::fcntl(c.fd, F_GETFL, 0);
  ::fcntl(c.fd, F_SETFL, flags | O_NONBLOCK);
  if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno != EINPROGRESS) {
      *last = std::strerror(errno);
      return -1;
    }
    pollfd pfd{c.fd, POLLOUT, 0};
    const double left = std::clamp(seconds_left(deadline), 0.0, 1e6);
    int pr = -1;
    do pr = ::poll(&pfd, 1, int(left * 1000));
    while (pr < 0 && errno == EINTR);
    int err = 0;
    socklen_t len = sizeof err;
    if (pr <= 0) err = ETIMEDOUT;
    else ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      *last = std::strerror(err);
      return -1;
    }
  }
  ::fcntl(c.fd, F_SETFL, flags);
  const int fd = c.fd;
  c.fd = -1;
  return fd;
}

// TCP_NODELAY: small messages leave at once.
inline void no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace nf4flash::sock
