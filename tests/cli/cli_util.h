// Running the nf4flash binary (or another program of the build) from tests: exit code, stdout and
// stderr of one command line.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace nf4flash::test {

struct CliResult {
  int code = -1;
  std::string out, err;
};

// Runs the program at `bin` with `args` (a shell command line), stdin from stdin_text; `env`
// (optional): variable assignments the command runs with, e.g. "NF4FLASH_PDL=0".
inline CliResult run_program(const std::string& bin, const std::string& args, const std::string& stdin_text = "",
                             const std::string& env = "") {
  namespace fs = std::filesystem;
  static int counter = 0;
  const fs::path base = fs::temp_directory_path() / ("nf4flash_cli_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
  const std::string err = base.string() + ".err", in = base.string() + ".in";
  std::ofstream(in) << stdin_text;
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + bin + " " + args + " <" + in + " 2>" + err;
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err, std::ios::binary);
  std::ostringstream os;
  os << e.rdbuf();
  r.err = os.str();
  fs::remove(err);
  fs::remove(in);
  return r;
}

// Runs the nf4flash binary.
inline CliResult run_cli(const std::string& args, const std::string& stdin_text = "", const std::string& env = "") {
  return run_program(NF4FLASH_BIN, args, stdin_text, env);
}

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace nf4flash::test
