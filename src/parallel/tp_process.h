// The tensor-parallel group of this process: one process per rank, rank 0 leading.
//
//   tp_process(n)      joins the group on first use and returns it. With torchrun's variables in
//                      the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
//                      parallel/rendezvous.h) the process is the rank they name, on any host.
//                      Without them (`--tp N` on one host) the process becomes rank 0 and spawns
//                      ranks 1..n-1 as `<this executable> tp-worker` on 127.0.0.1 and a free port,
//                      with LOCAL_RANK r (GPU r) and NCCL_NVLS_ENABLE=0, each in a process group of
//                      its own (a terminal's Ctrl-C reaches rank 0 alone) and killed with rank 0.
//   control            a TCP star between the ranks (parallel/tcp_group.h): rank 0 sends each
//                      engine load to the others over it (the CPU backend's collectives run on
//                      it too; CUDA ranks make an NCCL communicator per engine).
//
// A spawned rank that exits while rank 0 runs ends rank 0 with one error line naming it (NCCL
// collectives would otherwise wait for it forever). At exit rank 0 tells the other ranks to
// return and waits for the ones it spawned (10 s, then kills them).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/rendezvous.h"

namespace nf4flash {

struct TpProcess {
  RankEnv env;
  std::unique_ptr<Communicator> control;
  std::vector<int> children;  // the pids rank 0 spawned (none under torchrun-style launches)
};

// The group for `--tp n` (n > 1): joined now unless it already was. An error when the
// environment names a group of another size, or a rank of it cannot be started or reached.
TpProcess& tp_process(int n);
// The group this process is in, or null.
TpProcess* tp_process_if_joined();
// Joins the group the environment names (a tp-worker); an error naming the variables when none.
TpProcess& tp_process_from_env();

// The executable and arguments tp_process() spawns for ranks 1..n-1 (default: this executable
// with `tp-worker`).
void set_tp_worker_command(std::vector<std::string> argv);

// The tensor-parallel NF4FLASH_* settings (listed in runtime/env_settings.h's table).
struct TpSettings {
  double timeout_s = 120;  // NF4FLASH_TP_TIMEOUT: seconds a rank waits for the others to connect
  long parent_pid = 0;     // NF4FLASH_TP_PARENT: set by --tp in the ranks it starts; 0: unset
};
// The settings from the environment; an invalid value is an error naming the variable.
TpSettings tp_settings_from_env();

}  // namespace nf4flash
