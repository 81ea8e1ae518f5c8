// libFuzzer target: tokenizer.json loading (downloaded with models) and a round trip through the
// loaded tokenizer. The input is written to a file (the loader reads files); it must load or throw
// nf4flash::Error, and a loaded tokenizer must encode and decode a fixed text without crashing.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/nf4flash-fuzz-tokenizer-" + std::to_string(getpid()) + ".json";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto tok = nf4flash::Tokenizer::from_files(path, "");
    const auto ids = tok->encode("Hello world, ünïcödé 123 <s>\n\t  x", true);
    (void)tok->decode(ids, false);
    (void)tok->decode(ids, true);
  } catch (const nf4flash::Error&) {
  }
  return 0;
}
