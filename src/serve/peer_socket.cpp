// PeerSocket (peer_socket.h).
#include "serve/peer_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>

namespace nf4flash::serve {
namespace {

// The numeric host and port of a socket address.
bool numeric(const sockaddr_storage& a, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s, NI_NUMERICHOST | NI_NUMERICSERV))
    return false;
  host = h;
  port = std::atoi(s);
  return true;
}

// "::ffff:127.0.0.1" and "127.0.0.1" name the same IPv4 end.
std::string plain_v4(const std::string& h) { return h.rfind("::ffff:", 0) == 0 ? h.substr(7) : h; }

bool same_end(const sockaddr_storage& a, socklen_t len, const std::string& host, int port) {
  std::string h;
  int p = -1;
  return numeric(a, len, h, p) && p == port && plain_v4(h) == plain_v4(host);
}

}  // namespace

PeerSocket::PeerSocket(const std::string& local_addr, int local_port, const std::string& remote_addr,
                       int remote_port) {
  if (local_port < 0 || remote_port < 0) return;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end) continue;
    sockaddr_storage peer{}, self{};
    socklen_t pl = sizeof peer, sl = sizeof self;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;  // not a connected socket
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&self), &sl) != 0) continue;
    if (same_end(peer, pl, remote_addr, remote_port) && same_end(self, sl, local_addr, local_port)) {
      fd_ = int(fd);
      break;
    }
  }
  closedir(d);
}

bool PeerSocket::gone() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, short(POLLRDHUP), 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace nf4flash::serve
