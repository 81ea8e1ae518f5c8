// Whether the client of a request still holds its connection. cpp-httplib 0.11 (Debian's) gives a
// handler no access to its socket, so the socket is found among the process's descriptors by its
// two ends (the request's local and remote address and port), once per request; afterwards a
// zero-timeout poll says whether the peer closed or reset it. Linux (/proc/self/fd).
#pragma once
#include <string>

namespace nf4flash::serve {

class PeerSocket {
 public:
  // The connected TCP socket whose local end is local_addr:local_port and whose peer is
  // remote_addr:remote_port (numeric addresses as cpp-httplib reports them); none found: gone()
  // is always false.
  PeerSocket(const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port);
  bool found() const { return fd_ >= 0; }
  // The peer closed its side or reset the connection (poll: POLLRDHUP, POLLHUP or POLLERR).
  bool gone() const;

 private:
  int fd_ = -1;
};

}  // namespace nf4flash::serve
