// The tensor-parallel step protocol: rank 0 decides every forward (the token ids, the positions,
// the paged cache's block tables, which rows give logits) and hands it to the other ranks, which
// run the same forward on their shards; the followers need no scheduler, tokenizer or sampler.
//
//   rank 0:       TpLeader::forward(step, logits)  broadcasts the step, then runs it
//                 TpLeader::kv_allocate(...)       the KV cache on every rank (contiguous or paged)
//                 TpLeader::stop()                 tells the followers to return
//   other ranks:  tp_follow(comm, runner)          runs what rank 0 sends until stop
//
// A step goes as one broadcast_bytes of its encoding (little-endian int32 fields, sizes first);
// decode_step checks the sizes against each other, so a malformed message is one clear error.
// Every rank runs a step through TpStepRunner, which replays captured CUDA graphs where the backend
// has them (the NCCL collectives inside): one for single-token steps on the contiguous cache, and
// one per (sequences, block-table width) for the batched engine's decode-only steps on the paged
// cache; so rank 0's steps and the followers' cost the same launches.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/decoder.h"
#include "model/step_graph.h"
#include "parallel/communicator.h"

namespace nf4flash {

enum class TpOp : int32_t { Forward = 0, Stop = 1, KvCache = 2 };

struct TpStep {
  TpOp op = TpOp::Forward;
  // KvCache: the cache every rank allocates for its kv heads (its decoder's kv_heads()): capacity
  // tokens contiguous (kv_blocks 0), or kv_blocks paged blocks of kv_block_size positions
  int64_t kv_capacity = 0, kv_blocks = 0;
  int32_t kv_block_size = 0;
  DType kv_dtype = DType::F32;
  std::vector<int32_t> ids;  // the forward's T tokens
  int32_t pos0 = 0;          // contiguous cache: the position of ids[0]
  // the paged cache (empty row_start: contiguous): PagedSeqs' arrays
  std::vector<int32_t> row_start, seq_pos0, block_tables;
  int32_t max_blocks = 0;
  int32_t n_logits = 1;              // rows that give logits: logit_rows, or the last n_logits
  std::vector<int32_t> logit_rows;   // empty: the last n_logits rows
};

std::vector<uint8_t> encode_step(const TpStep& s);
// The step in `bytes`, checked (check_step).
TpStep decode_step(const std::vector<uint8_t>& bytes);
// A forward's fields against each other (tokens, logit rows, the paged arrays' sizes); one clear
// error naming what disagrees.
void check_step(const TpStep& s);

// One rank's forward of a step: the step's arrays uploaded into this rank's backend, then its
// (sharded) decoder's forward into logits [n_logits, vocab] F32.
class TpStepRunner {
 public:
  TpStepRunner(Decoder& dec, Backend& be);
  void run(const TpStep& s, Act logits);
  // A KvCache step: the decoder's cache (kv_allocate or kv_allocate_paged) for this rank's heads.
  void kv(const TpStep& s);
  // Where the backend has graphs, single-token steps on the contiguous cache and decode-only steps
  // on the paged cache (one row per sequence, each giving logits) replay captured graphs. A paged
  // shape (sequences, block-table width rounded up to a power of two) runs uncaptured the first
  // time (sizing every workspace), captured from the second.
  void set_graphs(bool on) { graphs_ = on; }
  // paged decode-only shapes captured so far (tests)
  size_t paged_graphs() const;
  // logits of a step on this rank when the caller has none (followers): [n_logits, vocab] F32
  Act scratch_logits(int64_t n_logits);

 private:
  const int32_t* put(std::unique_ptr<Buffer>& b, const std::vector<int32_t>& v);
  void run_graphed(int32_t id, int32_t pos, Act logits);
  bool run_paged_graphed(const TpStep& s, Act logits);
  Decoder& dec_;
  Backend& be_;
  std::unique_ptr<Buffer> ids_, pos_, row_start_, seq_pos0_, tables_, logit_rows_, logits_;
  // the captured single-token step and its inputs' fixed buffers
  bool graphs_ = false;
  std::unique_ptr<Buffer> g_id_, g_pos_;
  StepGraph graph_;
  // decode-only paged steps by (sequences, table width): the graph and its inputs' fixed buffer
  struct PagedGraph {
    StepGraph graph;
    std::unique_ptr<Buffer> inputs;  // ids, pos0, row_start, padded tables (run_paged_graphed)
    bool warmed = false;  // one uncaptured run done
    bool captured = false;
  };
  std::map<std::pair<int, int>, PagedGraph> paged_;
  std::vector<int32_t> paged_host_;  // the host staging of a paged step's inputs (reused)
};

class TpLeader {
 public:
  TpLeader(Communicator& comm, TpStepRunner& runner);
  void forward(const TpStep& s, Act logits);
  // The KV cache on every rank: `capacity` tokens contiguous (n_blocks 0), else n_blocks paged
  // blocks of block_size positions.
  void kv_allocate(int64_t capacity, DType dtype, int64_t n_blocks = 0, int block_size = 0);
  void stop();

 private:
  Communicator& comm_;
  TpStepRunner& runner_;
};

// Rank 0 tells the followers to return (what TpLeader::stop sends; also where rank 0 has no
// leader yet because its load failed).
void tp_stop(Communicator& comm);

// Runs rank 0's steps (forwards and KV caches) until it stops the group; returns the number of
// forwards run.
int64_t tp_follow(Communicator& comm, TpStepRunner& runner);

}  // namespace nf4flash
