// nf4flash CLI entry: subcommands come from the registry filled by each cmd_*.cpp file.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "core/error.h"
#include "runtime/env_settings.h"

namespace nf4flash::cli {

std::vector<CommandDef>& command_registry() {
  static std::vector<CommandDef> r;
  return r;
}

std::vector<int32_t> parse_id_list(const std::string& s, const std::string& flag) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t\n\r"));
    item.erase(item.find_last_not_of(" \t\n\r") + 1);
    if (item.empty()) continue;
    size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != item.size() || v < 0 || v > INT32_MAX) fail(flag, ": '", item, "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace nf4flash::cli

int main(int argc, char** argv) {
  using namespace nf4flash::cli;
  CLI::App app{"nf4flash: run Hugging Face language models locally, fast"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("nf4flash ") + NF4FLASH_VERSION);
  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<std::pair<CLI::App*, CommandRun>> subs;
  for (auto& def : reg) {
    CLI::App* sub = app.add_subcommand(def.name, def.help);
    subs.emplace_back(sub, def.setup(*sub));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    for (const std::string& w : nf4flash::check_env_settings()) std::fprintf(stderr, "warning: %s\n", w.c_str());
    for (auto& [sub, run] : subs)
      if (sub->parsed()) return run();
  } catch (const nf4flash::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 1;
}
