// `nf4flash tp-worker`: a tensor-parallel rank other than 0. It joins the group its environment
// names (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), then loads and runs its shard of
// every engine rank 0 loads, until rank 0 exits (runtime/engine_tp.h). `--tp N` starts these
// itself on one host; on other hosts they are started by hand or by a launcher (docs/serving.md).
#include <memory>

#include "commands.h"
#include "runtime/engine_tp.h"

namespace nf4flash::cli {
namespace {

NF4FLASH_COMMAND("tp-worker",
                 "Run as a tensor-parallel rank other than 0 (RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT from "
                 "the environment): load and run what rank 0 sends",
                 [](CLI::App& app) -> CommandRun {
                   auto quiet = std::make_shared<bool>(false);
                   app.add_flag("--quiet,-q", *quiet, "no progress lines on stderr");
                   return [quiet] { return run_tp_worker(*quiet); };
                 });

}  // namespace
}  // namespace nf4flash::cli
