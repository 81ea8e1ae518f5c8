// nf4flash CLI entry: subcommands registered by each tools/nf4flash/cmd_*.cpp file.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"nf4flash: run Hugging Face language models locally, fast"};
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const nf4flash::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
