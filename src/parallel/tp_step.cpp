// The tensor-parallel step protocol (parallel/tp_step.h).
#include "parallel/tp_step.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace nf4flash {

namespace {

constexpr int32_t kMagic = 0x5450'5332;  // "TPS2"

void put_i32(std::vector<uint8_t>& b, int32_t v) {
  const size_t at = b.size();
  b.resize(at + 4);
  std::memcpy(b.data() + at, &v, 4);
}
void put_i64(std::vector<uint8_t>& b, int64_t v) {
  put_i32(b, int32_t(uint32_t(uint64_t(v))));
  put_i32(b, int32_t(uint32_t(uint64_t(v) >> 32)));
}
void put_vec(std::vector<uint8_t>& b, const std::vector<int32_t>& v) {
  put_i32(b, int32_t(v.size()));
  const size_t at = b.size();
  b.resize(at + v.size() * 4);
  if (!v.empty()) std::memcpy(b.data() + at, v.data(), v.size() * 4);
}

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& b) : b_(b) {}
  int32_t i32() {
    if (at_ + 4 > b_.size()) fail("tensor parallel step: message ends at byte ", b_.size(), " inside a field");
    int32_t v;
    std::memcpy(&v, b_.data() + at_, 4);
    at_ += 4;
    return v;
  }
  int64_t i64() {
    const uint64_t lo = uint32_t(i32()), hi = uint32_t(i32());
    return int64_t(lo | hi << 32);
  }
  std::vector<int32_t> vec() {
    const int32_t n = i32();
    if (n < 0 || size_t(n) * 4 > b_.size() - at_)
      fail("tensor parallel step: an array of ", n, " entries overruns the ", b_.size(), "-byte message");
    std::vector<int32_t> v(static_cast<size_t>(n), 0);
    if (n) std::memcpy(v.data(), b_.data() + at_, size_t(n) * 4);
    at_ += size_t(n) * 4;
    return v;
  }
  bool done() const { return at_ == b_.size(); }

 private:
  const std::vector<uint8_t>& b_;
  size_t at_ = 0;
};

}  // namespace

std::vector<uint8_t> encode_step(const TpStep& s) {
  std::vector<uint8_t> b;
  put_i32(b, kMagic);
  put_i32(b, int32_t(s.op));
  put_i64(b, s.kv_capacity);
  put_i64(b, s.kv_blocks);
  put_i32(b, s.kv_block_size);
  put_i32(b, int32_t(s.kv_dtype));
  put_vec(b, s.ids);
  put_i32(b, s.pos0);
  put_vec(b, s.row_start);
  put_vec(b, s.seq_pos0);
  put_vec(b, s.block_tables);
  put_i32(b, s.max_blocks);
  put_i32(b, s.n_logits);
  put_vec(b, s.logit_rows);
  return b;
}

TpStep decode_step(const std::vector<uint8_t>& bytes) {
  Reader r(bytes);
  if (r.i32() != kMagic) fail("tensor parallel step: the message does not start with the step marker");
  TpStep s;
  const int32_t op = r.i32();
  if (op < int32_t(TpOp::Forward) || op > int32_t(TpOp::KvCache)) fail("tensor parallel step: unknown operation ", op);
  s.op = TpOp(op);
  s.kv_capacity = r.i64();
  s.kv_blocks = r.i64();
  s.kv_block_size = r.i32();
  const int32_t dt = r.i32();
  if (dt != int32_t(DType::F32) && dt != int32_t(DType::BF16) && dt != int32_t(DType::F16))
    fail("tensor parallel step: KV cache dtype ", dt);
  s.kv_dtype = DType(dt);
  s.ids = r.vec();
  s.pos0 = r.i32();
  s.row_start = r.vec();
  s.seq_pos0 = r.vec();
  s.block_tables = r.vec();
  s.max_blocks = r.i32();
  s.n_logits = r.i32();
  s.logit_rows = r.vec();
  if (!r.done()) fail("tensor parallel step: ", bytes.size(), "-byte message has bytes after its last field");
  check_step(s);
  return s;
}

void check_step(const TpStep& s) {
  if (s.op == TpOp::Stop) return;
  if (s.op == TpOp::KvCache) {
    if (s.kv_blocks < 0 || (s.kv_blocks == 0 && s.kv_capacity < 1) || (s.kv_blocks > 0 && s.kv_block_size < 1))
      fail("tensor parallel step: a KV cache of ", s.kv_capacity, " tokens, ", s.kv_blocks, " blocks of ",
           s.kv_block_size);
    return;
  }
  const int64_t T = int64_t(s.ids.size());
  if (T == 0) fail("tensor parallel step: a forward of no tokens");
  if (s.pos0 < 0) fail("tensor parallel step: position ", s.pos0);
  if (s.n_logits < 1 || s.n_logits > T) fail("tensor parallel step: ", s.n_logits, " logit rows of ", T, " rows");
  if (!s.logit_rows.empty() && int64_t(s.logit_rows.size()) != s.n_logits)
    fail("tensor parallel step: ", s.logit_rows.size(), " logit rows named, ", s.n_logits, " expected");
  for (int32_t row : s.logit_rows)
    if (row < 0 || row >= T) fail("tensor parallel step: logit row ", row, " outside the step's ", T, " rows");
  if (!s.row_start.empty()) {
    const size_t n = s.seq_pos0.size();
    if (n == 0 || s.row_start.size() != n + 1 || s.row_start.front() != 0 || s.row_start.back() != T)
      fail("tensor parallel step: row starts of ", s.row_start.size(), " entries for ", n, " sequences of ", T, " rows");
    if (s.max_blocks < 1 || s.block_tables.size() != n * size_t(s.max_blocks))
      fail("tensor parallel step: ", s.block_tables.size(), " block-table entries for ", n, " sequences of ", s.max_blocks);
  }
}

TpStepRunner::TpStepRunner(Decoder& dec, Backend& be) : dec_(dec), be_(be) {}

// A step's input in backend memory: the buffer grows to twice the need and is reused, so steps
// whose tables and rows grow a little at a time allocate rarely.
const int32_t* TpStepRunner::put(std::unique_ptr<Buffer>& b, const std::vector<int32_t>& v) {
  const size_t bytes = std::max<size_t>(v.size(), 1) * 4;
  if (!b || b->bytes() < bytes) {
    b.reset();
    b = be_.alloc(2 * bytes);
  }
  if (!v.empty()) be_.upload(b->data(), v.data(), v.size() * 4);
  return static_cast<const int32_t*>(b->data());
}

Act TpStepRunner::scratch_logits(int64_t n_logits) {
  const int64_t V = dec_.config().vocab_size;
  const size_t bytes = size_t(n_logits * V) * 4;
  if (!logits_ || logits_->bytes() < bytes) logits_ = be_.alloc(bytes);
  return Act{logits_->data(), DType::F32, n_logits, V};
}

void TpStepRunner::kv(const TpStep& s) {
  const ModelConfig& c = dec_.config();
  const KVCacheDesc d{c.n_layers, dec_.kv_heads(), c.head_dim, s.kv_capacity, s.kv_dtype};
  if (s.kv_blocks > 0) dec_.kv_allocate_paged(d, s.kv_blocks, s.kv_block_size);
  else dec_.kv_allocate(d);
}

void TpStepRunner::run_graphed(int32_t id, int32_t pos, Act logits) {
  if (!g_id_) {
    g_id_ = be_.alloc(4);
    g_pos_ = be_.alloc(4);
  }
  be_.upload(g_id_->data(), &id, 4);
  be_.upload(g_pos_->data(), &pos, 4);
  StepState st;
  st.pos0 = static_cast<int32_t*>(g_pos_->data());
  st.pos0_host = -1;  // replays run at other positions: nothing may depend on this one
  graph_.run(dec_, be_, logits.data, [&] { dec_.forward(static_cast<const int32_t*>(g_id_->data()), 1, st, logits, 1); });
}

// A decode-only step on the paged cache (row i is sequence i's one token and gives logits row i)
// through the graph of its shape: the step's arrays go into that shape's fixed buffer in one
// upload, [ids n][pos0 n][row_start n + 1][tables n x width], the block tables padded to the
// shape's width (entries past a sequence's blocks are never read).
bool TpStepRunner::run_paged_graphed(const TpStep& s, Act logits) {
  const int n = int(s.seq_pos0.size());
  if (int(s.ids.size()) != n || s.n_logits != n) return false;
  for (int i = 0; i <= n; ++i)
    if (s.row_start[size_t(i)] != i) return false;
  for (int i = 0; i < int(s.logit_rows.size()); ++i)
    if (s.logit_rows[size_t(i)] != i) return false;
  int width = 8;
  while (width < s.max_blocks) width *= 2;
  PagedGraph& g = paged_[{n, width}];
  const size_t words = size_t(n) * (3 + width) + 1;
  if (!g.inputs) g.inputs = be_.alloc(words * 4);
  std::vector<int32_t>& h = paged_host_;
  h.assign(words, 0);
  std::copy_n(s.ids.begin(), n, h.begin());
  std::copy_n(s.seq_pos0.begin(), n, h.begin() + n);
  std::copy_n(s.row_start.begin(), n + 1, h.begin() + 2 * n);
  for (int i = 0; i < n; ++i)
    std::copy_n(s.block_tables.begin() + size_t(i) * s.max_blocks, s.max_blocks,
                h.begin() + (3 * n + 1) + size_t(i) * width);
  be_.upload(g.inputs->data(), h.data(), words * 4);
  const int32_t* in = static_cast<const int32_t*>(g.inputs->data());
  PagedSeqs ps;
  ps.n_seqs = n;
  ps.pos0 = in + n;
  ps.row_start = in + 2 * n;
  ps.block_tables = in + 3 * n + 1;
  ps.max_blocks = width;  // no host view of the rows: every row takes flash-decoding, as captured
  StepState st;
  st.paged = &ps;
  auto forward = [&] { dec_.forward(in, n, st, logits, n); };
  if (!g.warmed) {
    forward();
    g.warmed = true;
  } else {
    g.graph.run(dec_, be_, logits.data, forward);
    g.captured = true;
  }
  return true;
}

size_t TpStepRunner::paged_graphs() const {
  size_t k = 0;
  for (const auto& [shape, g] : paged_) k += g.captured ? 1 : 0;
  return k;
}

void TpStepRunner::run(const TpStep& s, Act logits) {
  NF4FLASH_CHECK(s.op == TpOp::Forward, "tensor parallel step: run() takes forwards");
  const int64_t T = int64_t(s.ids.size());
  NF4FLASH_CHECK(logits.dtype == DType::F32 && logits.rows == s.n_logits && logits.cols == dec_.config().vocab_size,
                 "tensor parallel step: logits must be f32 [", s.n_logits, ", ", dec_.config().vocab_size, "]");
  if (graphs_ && be_.graphs_supported() && T == 1 && s.row_start.empty() && s.logit_rows.empty())
    return run_graphed(s.ids[0], s.pos0, logits);
  if (graphs_ && be_.graphs_supported() && !s.row_start.empty() &&
      dec_.offload_first_layer() == dec_.config().n_layers && run_paged_graphed(s, logits))
    return;
  const int32_t* ids = put(ids_, s.ids);
  const int32_t* logit_rows = s.logit_rows.empty() ? nullptr : put(logit_rows_, s.logit_rows);
  StepState st;
  PagedSeqs ps;
  if (s.row_start.empty()) {
    st.pos0 = const_cast<int32_t*>(put(pos_, {s.pos0}));
    st.pos0_host = s.pos0;
  } else {
    ps.n_seqs = int(s.seq_pos0.size());
    ps.row_start = put(row_start_, s.row_start);
    ps.pos0 = put(seq_pos0_, s.seq_pos0);
    ps.block_tables = put(tables_, s.block_tables);
    ps.max_blocks = s.max_blocks;
    ps.row_start_host = s.row_start.data();
    ps.pos0_host = s.seq_pos0.data();
    st.paged = &ps;
  }
  dec_.forward(ids, T, st, logits, s.n_logits, logit_rows);
}

TpLeader::TpLeader(Communicator& comm, TpStepRunner& runner) : comm_(comm), runner_(runner) {
  NF4FLASH_CHECK(comm.rank() == 0, "tensor parallel: rank ", comm.rank(), " cannot lead (rank 0 does)");
}

void TpLeader::forward(const TpStep& s, Act logits) {
  check_step(s);  // rank 0 refuses what its followers would
  std::vector<uint8_t> bytes = encode_step(s);
  comm_.broadcast_bytes(bytes);
  runner_.run(s, logits);
}

void TpLeader::kv_allocate(int64_t capacity, DType dtype, int64_t n_blocks, int block_size) {
  TpStep s;
  s.op = TpOp::KvCache;
  s.kv_capacity = capacity;
  s.kv_dtype = dtype;
  s.kv_blocks = n_blocks;
  s.kv_block_size = block_size;
  check_step(s);
  std::vector<uint8_t> bytes = encode_step(s);
  comm_.broadcast_bytes(bytes);
  runner_.kv(s);
}

void TpLeader::stop() { tp_stop(comm_); }

void tp_stop(Communicator& comm) {
  TpStep s;
  s.op = TpOp::Stop;
  std::vector<uint8_t> bytes = encode_step(s);
  comm.broadcast_bytes(bytes);
}

int64_t tp_follow(Communicator& comm, TpStepRunner& runner) {
  NF4FLASH_CHECK(comm.rank() != 0, "tensor parallel: rank 0 leads; it does not follow");
  int64_t n = 0;
  for (;;) {
    std::vector<uint8_t> bytes;
    comm.broadcast_bytes(bytes);
    const TpStep s = decode_step(bytes);
    if (s.op == TpOp::Stop) return n;
    if (s.op == TpOp::KvCache) {
      runner.kv(s);
      continue;
    }
    runner.run(s, runner.scratch_logits(s.n_logits));
    ++n;
  }
}

}  // namespace nf4flash
