// Collectives between the ranks of a tensor-parallel group, on buffers in each rank's backend
// memory: the interface the decoder calls (Communicator) and an in-process implementation for N
// ranks run as N threads of one process over CPU backends (InProcessGroup).
//
//   all_reduce_sum(buf):   every rank's buf becomes the elementwise sum over ranks, added in rank
//                          order ((b_0 + b_1) + b_2) + ..., so every rank holds the same bits
//                          whatever the timing of the threads.
//   all_gather_cols(l, o): o [rows, sum of the ranks' l.cols] = the ranks' l side by side, rank 0's
//                          columns first (the vocabulary-split logits of each rank into the full
//                          logits); ranks may hold different column counts.
//   barrier():             returns once every rank has entered it.
//   broadcast_bytes(b):    host bytes from rank 0 to every rank (b is resized to rank 0's size):
//                          how rank 0 hands each forward's inputs to the others (parallel/tp_step.h).
//
// Every rank calls the same collectives in the same order (as with NCCL). A rank that fails calls
// abort(): the others' pending and later collectives then throw instead of waiting forever.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <mutex>
#include <vector>

#include "backend/backend.h"

namespace nf4flash {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Where the buffers it reduces live: the device of the backends it serves.
  virtual Device device() const = 0;
  // In place over buf.rows * buf.cols contiguous elements; the same shape on every rank.
  virtual void all_reduce_sum(Act buf) = 0;
  // local [rows, c_r] on rank r; out [rows, c_0 + ... + c_{world-1}], the same rows on every rank.
  virtual void all_gather_cols(Act local, Act out) = 0;
  virtual void barrier() = 0;
  // Rank 0's bytes into every rank's `bytes` (host memory; ranks other than 0 pass any content).
  virtual void broadcast_bytes(std::vector<uint8_t>& bytes) = 0;
  // Wakes every rank waiting in a collective (they throw); later collectives throw too.
  virtual void abort() = 0;
};

// N communicators sharing one state, for N threads of one process whose buffers are host memory
// (CPU backends). F32 buffers only.
class InProcessGroup {
 public:
  explicit InProcessGroup(int world);
  ~InProcessGroup();
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;

  int world() const { return world_; }
  Communicator& comm(int rank);

 private:
  class Comm;
  friend class Comm;
  // Blocks until all `world_` ranks have arrived (a reusable generation barrier); the last to
  // arrive runs `on_last` (under the lock) before the others go on. Throws once the group is
  // aborted, or when on_last found the ranks' arguments inconsistent (the group is aborted then).
  void arrive_and_wait(const std::function<void()>& on_last = {});
  void abort(const std::string& why);

  int world_;
  std::vector<std::unique_ptr<Comm>> comms_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  std::string why_;  // the reason of the abort
  // what each rank publishes for the collective in progress
  std::vector<Act> bufs_;
  std::vector<float> scratch_;  // all_reduce_sum: the summed elements
  const std::vector<uint8_t>* root_bytes_ = nullptr;  // broadcast_bytes: rank 0's bytes
};

}  // namespace nf4flash
