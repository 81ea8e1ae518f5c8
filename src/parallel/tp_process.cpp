// The tensor-parallel group of this process (parallel/tp_process.h).
#include "parallel/tp_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "parallel/socket_util.h"
#include "parallel/tcp_group.h"

extern char** environ;

namespace nf4flash {

namespace {

std::mutex g_mu;
std::unique_ptr<TpProcess> g_proc;
std::vector<std::string> g_worker_cmd;
std::atomic<bool> g_shutting_down{false};
// set in the environment of the ranks --tp spawns: rank 0's pid
constexpr const char* kParentVar = "NF4FLASH_TP_PARENT";

int free_port() {
  const int port = sock::free_loopback_port();
  if (port < 0) fail("tensor parallel: cannot find a free port on 127.0.0.1: ", std::strerror(errno));
  return port;
}

std::vector<std::string> worker_command() {
  if (!g_worker_cmd.empty()) return g_worker_cmd;
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) fail("tensor parallel: cannot find this executable (/proc/self/exe) to start the other ranks");
  return {std::string(buf, size_t(n)), "tp-worker"};
}

// Starts rank r of `world` with the group's variables added to this process's environment.
int spawn_rank(const std::vector<std::string>& cmd, int r, int world, int port) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    if (key == "RANK" || key == "WORLD_SIZE" || key == "LOCAL_RANK" || key == "MASTER_ADDR" || key == "MASTER_PORT")
      continue;
    env.push_back(kv);
  }
  env.push_back(cat("RANK=", r));
  env.push_back(cat("WORLD_SIZE=", world));
  env.push_back(cat("LOCAL_RANK=", r));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back(cat("MASTER_PORT=", port));
  env.push_back(cat(kParentVar, "=", ::getpid()));
  if (!std::getenv("NCCL_NVLS_ENABLE")) env.push_back("NCCL_NVLS_ENABLE=0");
  std::vector<char*> argv, envp;
  for (const std::string& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // a process group of its own: a terminal's Ctrl-C reaches rank 0, which ends the group in order
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, cmd[0].c_str(), nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  if (rc != 0) fail("tensor parallel: cannot start rank ", r, " (", cmd[0], "): ", std::strerror(rc));
  return int(pid);
}

// Rank 0's watch over the ranks it spawned: one that exits before rank 0 shuts the group down
// ends rank 0 too (the others' collectives would wait for it forever).
void watch_children(std::vector<int> pids) {
  std::thread([pids] {
    for (;;) {
      int status = 0;
      const pid_t p = ::waitpid(-1, &status, 0);
      if (p < 0) {
        if (errno == EINTR) continue;
        return;  // no children left
      }
      int rank = -1;
      for (size_t i = 0; i < pids.size(); ++i)
        if (pids[i] == p) rank = int(i) + 1;
      if (rank < 0 || g_shutting_down.load()) continue;
      if (WIFEXITED(status))
        std::fprintf(stderr, "error: tensor parallel rank %d exited with status %d\n", rank, WEXITSTATUS(status));
      else
        std::fprintf(stderr, "error: tensor parallel rank %d ended by signal %d\n", rank, WTERMSIG(status));
      for (int q : pids)
        if (q != p) ::kill(q, SIGTERM);
      std::fflush(stderr);
      std::_Exit(1);
    }
  }).detach();
}

// At exit: rank 0 tells the others to return (the "exit" message, parallel/tp_process.h's users
// agree on it through tp_send_exit) and waits for the ranks it spawned.
void shutdown_group() {
  std::unique_ptr<TpProcess> p;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    p = std::move(g_proc);
  }
  if (!p) return;
  g_shutting_down = true;
  if (p->env.rank == 0) {
    try {
      std::vector<uint8_t> exit_msg{'e', 'x', 'i', 't'};
      p->control->broadcast_bytes(exit_msg);
    } catch (const std::exception&) {
      // a rank already gone: nothing to tell it
    }
  }
  p->control.reset();
  // the ranks it spawned return once told; one that does not within 10 s (stuck in a collective
  // whose peer is gone) is killed
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int pid : p->children) {
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(pid, &status, WNOHANG);
      if (r != 0 && !(r < 0 && errno == EINTR)) break;  // reaped here or by the watch, or gone
      if (std::chrono::steady_clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

TpProcess& join(const RankEnv& e, std::vector<int> children) {
  auto p = std::make_unique<TpProcess>();
  p->env = e;
  p->children = std::move(children);
  p->control = make_tcp_communicator(e, tp_settings_from_env().timeout_s);
  if (!p->children.empty()) watch_children(p->children);
  g_proc = std::move(p);
  std::atexit(shutdown_group);
  return *g_proc;
}

}  // namespace

TpSettings tp_settings_from_env() {
  TpSettings t;
  if (const char* v = std::getenv("NF4FLASH_TP_TIMEOUT"); v && *v) {
    char* end = nullptr;
    t.timeout_s = std::strtod(v, &end);
    if (*end || !(t.timeout_s > 0)) fail("NF4FLASH_TP_TIMEOUT=", v, ": expected seconds > 0");
  }
  if (const char* v = std::getenv(kParentVar); v && *v) {
    char* end = nullptr;
    t.parent_pid = std::strtol(v, &end, 10);
    if (*end || t.parent_pid <= 0) fail(kParentVar, "=", v, ": expected a process id (set by --tp, not by hand)");
  }
  return t;
}

void set_tp_worker_command(std::vector<std::string> argv) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_worker_cmd = std::move(argv);
}

TpProcess* tp_process_if_joined() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_proc.get();
}

TpProcess& tp_process_from_env() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_proc) return *g_proc;
  if (const long parent = tp_settings_from_env().parent_pid) {  // spawned by --tp: end with rank 0, however it ends
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) fail("tp-worker: rank 0 (pid ", parent, ") is gone");
  }
  const RankEnv e = rank_env();
  if (e.world < 2)
    fail("tp-worker: WORLD_SIZE is not set above 1; a worker is rank RANK of WORLD_SIZE ranks whose rank 0 listens on "
         "MASTER_ADDR:MASTER_PORT (nf4flash --tp N starts its workers itself)");
  if (e.rank == 0) fail("tp-worker: RANK is 0; rank 0 runs the command (serve, batch, run, bench) and leads");
  return join(e, {});
}

TpProcess& tp_process(int n) {
  NF4FLASH_CHECK(n >= 2, "--tp ", n, ": a tensor-parallel group has 2 or more ranks");
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_proc) {
    NF4FLASH_CHECK(g_proc->env.world == n, "--tp ", n, ": this process already runs in a group of ", g_proc->env.world);
    return *g_proc;
  }
  RankEnv e = rank_env();
  if (e.world > 1) {  // a torchrun-style launch: the environment names the group
    NF4FLASH_CHECK(e.world == n, "--tp ", n, " but WORLD_SIZE is ", e.world);
    NF4FLASH_CHECK(e.rank == 0, "--tp: RANK ", e.rank, " runs `nf4flash tp-worker`; rank 0 runs the command");
    return join(e, {});
  }
  e.world = n;
  e.rank = 0;
  e.local_rank = 0;
  e.master_addr = "127.0.0.1";
  e.master_port = free_port();
  const std::vector<std::string> cmd = worker_command();
  std::vector<int> pids;
  try {
    for (int r = 1; r < n; ++r) pids.push_back(spawn_rank(cmd, r, n, e.master_port));
    return join(e, pids);
  } catch (...) {
    for (int pid : pids) {
      ::kill(pid, SIGTERM);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
    throw;
  }
}

}  // namespace nf4flash
