// A Communicator over TCP between processes, one per rank, whose buffers are host memory (CPU
// backends): the cross-process counterpart of InProcessGroup (parallel/communicator.h), with the
// same results bit for bit. The ranks find each other torchrun-style (RankEnv, parallel/rendezvous.h).
//
// Topology: a star. Rank 0 listens on MASTER_PORT (every interface) and keeps one connection to
// each other rank, which connects to MASTER_ADDR:MASTER_PORT, retrying while rank 0 starts.
// Sockets are blocking, TCP_NODELAY; numbers on the wire are little-endian, elements raw f32.
//
// Handshake (bounded by timeout_s): each rank sends "nf4flash-tpc" (12 bytes), its rank and its
// WORLD_SIZE (int32 each). Rank 0 drops a connection that does not greet so (a port scanner); a
// rank outside [1, world), a rank connecting twice or another WORLD_SIZE is an error on rank 0,
// whose closing the connections fails the other ranks' handshakes. Once every rank has connected,
// rank 0 answers each with the same 12 bytes and world; only then does the group exist anywhere.
//
// Collectives: every message starts with a header of four uint64 (op, a, b, c). In each
// collective every rank r > 0 first sends rank 0 a header, rank 0 reads them in rank order and
// checks that all ranks call the same collective with consistent shapes, then answers each rank:
//   all_reduce_sum:  r -> 0: (1, n) + n elements. Rank 0 adds them to its own in rank order,
//                    ((b_0 + b_1) + b_2) + ..., and sends (1, n) + the n sums to every rank.
//   all_gather_cols: r -> 0: (2, rows, c_r, out cols) + the [rows, c_r] block. Rank 0 places
//                    the blocks side by side in rank order and sends (2, rows, out cols) + out.
//   barrier:         r -> 0: (3); 0 -> r: (3), once rank 0 has heard from every rank.
//   broadcast_bytes: r -> 0: (4), that it is ready; 0 -> r: (4, size) + rank 0's bytes.
//
// Errors: no collective has a timeout; rank 0 may be slow. A rank that fails calls abort(), which
// shuts its sockets down (shutdown(SHUT_RDWR)) so that its own blocked call and the other ranks'
// collectives fail; a rank that exits closes its connection the same way. When rank 0 finds a rank
// that closed its connection, calls another collective or passes another shape, it sends every
// other rank an error message (op 0xE, a = its length, then the text) and shuts its connections
// down: every rank then throws nf4flash::Error naming the rank and what failed, e.g.
// "tensor parallel: rank 1 closed its connection during all_reduce_sum". A rank never blocks in a
// send while the other end has something to say (an error, its end of the connection closed), so
// a failure never leaves a rank waiting forever. After a failure every collective throws.
// A host that vanishes without closing its connections is not detected.
#pragma once
#include <memory>

#include "parallel/communicator.h"
#include "parallel/rendezvous.h"

namespace nf4flash {

// Joins the group of e.world ranks as rank e.rank (a group of one needs no sockets). Rank 0
// listens on e.master_port; the other ranks connect to e.master_addr:e.master_port. Waits at most
// timeout_s for the whole group; errors name the address, the rank and what failed. F32 buffers.
std::unique_ptr<Communicator> make_tcp_communicator(const RankEnv& e, double timeout_s);

}  // namespace nf4flash
