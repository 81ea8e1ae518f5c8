// The tensor-parallel step protocol: rank 0 decides every forward (the token ids, the positions,
// the paged cache's block tables, which rows give logits) and hands it to the other ranks, which
// run the same forward on their shards; the followers need no scheduler, tokenizer or sampler.
//
//   rank 0:       TpLeader::forward(step, logits)  broadcasts the step, then runs it
//                 TpLeader::stop()                 tells the followers to return
//   other ranks:  tp_follow(comm, runner)          runs the steps rank 0 sends until stop
//
// A step goes as one broadcast_bytes of its encoding (little-endian int32 fields, sizes first);
// decode_step checks the sizes against each other, so a malformed message is one clear error.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/decoder.h"
#include "parallel/communicator.h"

namespace nf4flash {

struct TpStep {
  bool stop = false;
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
  // logits of a step on this rank when the caller has none (followers): [n_logits, vocab] F32
  Act scratch_logits(int64_t n_logits);

 private:
  const int32_t* put(std::unique_ptr<Buffer>& b, const std::vector<int32_t>& v);
  Decoder& dec_;
  Backend& be_;
  std::unique_ptr<Buffer> ids_, pos_, row_start_, seq_pos0_, tables_, logit_rows_, logits_;
};

class TpLeader {
 public:
  TpLeader(Communicator& comm, TpStepRunner& runner);
  void forward(const TpStep& s, Act logits);
  void stop();

 private:
  Communicator& comm_;
  TpStepRunner& runner_;
};

// Runs rank 0's steps until it stops the group; returns the number of forwards run.
int64_t tp_follow(Communicator& comm, TpStepRunner& runner);

}  // namespace nf4flash
