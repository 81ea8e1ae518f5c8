// The NF4FLASH_* environment settings the engine reads (CudaTuning's, backend/cuda_tuning.h, the
// decode loop's NF4FLASH_DECODE_PIPELINE and TpSettings', parallel/tp_process.h): one table, and the check the CLI runs before any
// subcommand, so that an invalid value is an error naming the variable whatever the device.
#pragma once
#include <string>
#include <vector>

namespace nf4flash {

struct EnvSetting {
  const char* name;
  const char* values;   // the accepted values
  const char* meaning;  // one line
};
const std::vector<EnvSetting>& env_settings();

// Parses every setting that is set (throws Error naming the first invalid one) and returns one
// warning line per NF4FLASH_* variable that is set but is no setting (a misspelt or retired name
// has no effect: the user is told rather than left to guess).
std::vector<std::string> check_env_settings();

}  // namespace nf4flash
