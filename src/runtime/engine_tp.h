// An engine's part in a tensor-parallel group (parallel/tp_process.h, parallel/tp_step.h).
//
// Rank 0 loads an engine as usual with LoadOptions::tp > 1: build_engine first sends the other
// ranks a load message over the group's control connection (what to load: a folder or a preset,
// the options, the device, the NCCL id of the engine's communicator on CUDA), then every rank
// loads its shard of the weights. Rank 0's forwards and KV caches go to the other ranks as
// TpSteps (TpLeader); the others run them (tp_follow) until rank 0's engine is destroyed, then
// wait for the next load message, or for "exit".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/decoder.h"
#include "parallel/communicator.h"
#include "parallel/tp_step.h"
#include "runtime/plan.h"

namespace nf4flash {

// What a follower was told to load (rank 0's load message).
struct TpFollowerLoad {
  std::vector<uint8_t> nccl_id;  // CUDA: the engine communicator's id; empty on the CPU
};

struct TpEngine {
  int rank = 0, world = 1, local_rank = 0;
  Communicator* control = nullptr;         // the process group's TCP star
  std::vector<uint8_t> nccl_id;            // CUDA
  std::unique_ptr<Communicator> owned;     // CUDA: the engine's NCCL communicator
  Communicator* comm = nullptr;            // the engine's collectives: owned, or control on the CPU
  std::unique_ptr<TpStepRunner> runner;
  std::unique_ptr<TpLeader> leader;        // rank 0
  ~TpEngine();                             // rank 0: the followers stop (their engines end)
  TpShard shard() const { return TpShard{rank, world, comm}; }
};

// Rank 0 (follower null): checks the options, joins the group (tp_process) and sends the load
// message for `source` (build_engine's model name: a folder, or "preset:<name>"). A follower:
// its part as rank 0's message says. The communicator comes with tp_engine_connect.
std::unique_ptr<TpEngine> tp_engine_begin(const LoadOptions& o, const Plan& plan, const std::string& source,
                                          const TpFollowerLoad* follower);
// The engine's communicator on its backend (NCCL on CUDA, the control group on the CPU).
void tp_engine_connect(TpEngine& t, Backend& be);
// After the decoder: the step runner (graphs as the engine's decode steps use them), and rank 0's
// leader.
void tp_engine_finish(TpEngine& t, Decoder& dec, Backend& be, bool graphs);

// `nf4flash tp-worker`: joins the group the environment names and runs rank 0's loads until it
// says "exit". `log` gets one line per load (null: silent). Returns the exit code.
int run_tp_worker(bool quiet);

}  // namespace nf4flash
