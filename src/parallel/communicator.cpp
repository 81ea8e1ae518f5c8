// InProcessGroup: the collectives of N ranks run as threads of one process (see communicator.h).
#include "parallel/communicator.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace nf4flash {

class InProcessGroup::Comm final : public Communicator {
 public:
  Comm(InProcessGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return g_.world_; }
  Device device() const override { return Device::CPU; }  // host memory

  // Each rank sums its share of the elements over all ranks in rank order into the scratch; once
  // every share is summed, each rank copies the whole sum into its buffer.
  void all_reduce_sum(Act buf) override {
    check_f32(buf, "all_reduce_sum");
    const int64_t n = buf.numel();
    g_.bufs_[size_t(rank_)] = buf;
    g_.arrive_and_wait([this, n] {
      for (const Act& b : g_.bufs_)
        if (b.numel() != n) g_.abort(cat("all_reduce_sum: ranks pass ", b.numel(), " and ", n, " elements"));
      g_.scratch_.resize(size_t(n));
    });
    const int W = g_.world_;
    const int64_t e0 = n * rank_ / W, e1 = n * (rank_ + 1) / W;
    float* sum = g_.scratch_.data();
    std::copy_n(static_cast<const float*>(g_.bufs_[0].data) + e0, e1 - e0, sum + e0);
    for (int r = 1; r < W; ++r) {
      const float* src = static_cast<const float*>(g_.bufs_[size_t(r)].data);
      for (int64_t i = e0; i < e1; ++i) sum[i] += src[i];
    }
    g_.arrive_and_wait();
    std::memcpy(buf.data, sum, size_t(n) * 4);
    // the next collective resizes the scratch only once every rank has arrived at it, so no
    // rank can still be copying from it then
  }

  void all_gather_cols(Act local, Act out) override {
    check_f32(local, "all_gather_cols");
    check_f32(out, "all_gather_cols");
    g_.bufs_[size_t(rank_)] = local;
    g_.arrive_and_wait([this, out] {
      int64_t cols = 0;
      for (const Act& b : g_.bufs_) {
        if (b.rows != out.rows) g_.abort(cat("all_gather_cols: a rank passes ", b.rows, " rows, the output has ", out.rows));
        cols += b.cols;
      }
      if (cols != out.cols) g_.abort(cat("all_gather_cols: the ranks pass ", cols, " columns, the output has ", out.cols));
    });
    int64_t c0 = 0;
    for (const Act& b : g_.bufs_) {
      for (int64_t r = 0; r < out.rows; ++r)
        std::memcpy(static_cast<float*>(out.data) + r * out.cols + c0, static_cast<const float*>(b.data) + r * b.cols,
                    size_t(b.cols) * 4);
      c0 += b.cols;
    }
    g_.arrive_and_wait();  // every rank has read the others' local buffers
  }

  void barrier() override { g_.arrive_and_wait(); }

  void broadcast_bytes(std::vector<uint8_t>& bytes) override {
    if (rank_ == 0) g_.root_bytes_ = &bytes;  // published before rank 0 arrives
    g_.arrive_and_wait();
    if (rank_ != 0) bytes = *g_.root_bytes_;
    g_.arrive_and_wait();  // every rank has copied rank 0's bytes (rank 0 may change them after)
  }

  void abort() override {
    std::lock_guard<std::mutex> lk(g_.mu_);
    g_.abort(cat("rank ", rank_, " aborted the group"));
  }

 private:
  static void check_f32(Act a, const char* op) {
    if (a.dtype != DType::F32) fail(op, ": the in-process group reduces F32 buffers only, not ", dtype_name(a.dtype));
  }
  InProcessGroup& g_;
  int rank_;
};

InProcessGroup::InProcessGroup(int world) : world_(world) {
  if (world < 1) fail("tensor parallel: a group of ", world, " ranks");
  for (int r = 0; r < world; ++r) comms_.push_back(std::make_unique<Comm>(*this, r));
  bufs_.resize(size_t(world));
}

InProcessGroup::~InProcessGroup() = default;

Communicator& InProcessGroup::comm(int rank) {
  if (rank < 0 || rank >= world_) fail("tensor parallel: rank ", rank, " outside a group of ", world_);
  return *comms_[size_t(rank)];
}

// Called with mu_ held.
void InProcessGroup::abort(const std::string& why) {
  if (!aborted_) why_ = why;
  aborted_ = true;
  cv_.notify_all();
}

void InProcessGroup::arrive_and_wait(const std::function<void()>& on_last) {
  std::unique_lock<std::mutex> lk(mu_);
  if (aborted_) fail("tensor parallel: ", why_);
  const uint64_t gen = generation_;
  if (++arrived_ == world_) {
    if (on_last) on_last();
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  } else {
    cv_.wait(lk, [&] { return generation_ != gen || aborted_; });
  }
  if (aborted_) fail("tensor parallel: ", why_);
}

}  // namespace nf4flash
