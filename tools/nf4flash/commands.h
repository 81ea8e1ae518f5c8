// Subcommand registry: each tools/nf4flash/cmd_*.cpp registers itself with NF4FLASH_COMMAND.
// setup(app) declares the subcommand's options on `app` and returns the function that runs it
// (called after parsing; returns the exit code). Errors thrown as nf4flash::Error become one
// "error: ..." line on stderr and exit code 1.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace nf4flash::cli {

using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App&)>;

struct CommandDef {
  std::string name;
  std::string help;
  CommandSetup setup;
};

std::vector<CommandDef>& command_registry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, std::string help, CommandSetup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

#define NF4FLASH_COMMAND_CAT2(a, b) a##b
#define NF4FLASH_COMMAND_CAT(a, b) NF4FLASH_COMMAND_CAT2(a, b)
#define NF4FLASH_COMMAND(name, help, setup) \
  static ::nf4flash::cli::CommandRegistrar NF4FLASH_COMMAND_CAT(g_cmd_, __LINE__)(name, help, setup)

// Parses "1,2,3" into ids; throws Error naming `flag` on a bad entry.
std::vector<int32_t> parse_id_list(const std::string& s, const std::string& flag);
// Reads a whole file; throws Error naming the file.
std::string read_text_file(const std::string& path);

}  // namespace nf4flash::cli
