// Errors: one exception type carrying a single human-readable line that names the file, tensor or
// flag at fault. The CLI catches it, prints "error: <line>" on stderr and exits non-zero.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace nf4flash {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Concatenate anything streamable into one string: cat("tensor ", name, " has ", n, " dims").
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(Args&&... args) {
  throw Error(cat(std::forward<Args>(args)...));
}

#define NF4FLASH_CHECK(cond, ...)                \
  do {                                           \
    if (!(cond)) ::nf4flash::fail(__VA_ARGS__);  \
  } while (0)

}  // namespace nf4flash
