// Shared helpers for the test suite: fixture paths, golden tensors, distances, whole-file reads,
// temporary folders and running the nf4flash binary. Helpers of one area stay with its tests
// (unit/test_quant_util.h, unit/test_tokenizer_common.h, unit/test_bench_xml.h, ops/cuda_test_util.h).
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "backend/cuda_tuning.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "nf4flash/engine.h"

namespace nf4flash::test {

inline std::string fixture(const std::string& rel) { return std::string(NF4FLASH_FIXTURES_DIR) + "/" + rel; }
inline std::string model_dir(const std::string& name) { return fixture("models/" + name); }

// Every conformance model of tests/fixtures (those with f32 and bf16 goldens).
inline constexpr const char* kConformanceModels[] = {
    "llama-gqa-hd64",     "llama3-hd128-ropescaled", "qwen2-bias",           "llama2-tok-hd64",
    "phi3-longrope-hd96", "mixtral-moe",             "qwen2moe-shared",      "qwen3moe-topk",
    "gemma2-hd256-softcap", "gemma3-qknorm-window",  "llama-rope-yarn",      "llama-rope-dynamic",
    "mistral-hd32",       "llama-hd80"};

// The rows of one step over several sequences (PagedSeqs' layout): sequence i contributes its
// tokens [from[i], to[i]), starting at position from[i]; its last row gives logits.
struct PagedStepRows {
  std::vector<int32_t> ids, row_start{0}, pos0, logit_rows;
};
inline PagedStepRows paged_step_rows(const std::vector<std::vector<int32_t>>& seqs, const int64_t* from,
                                     const int64_t* to) {
  PagedStepRows r;
  for (size_t i = 0; i < seqs.size(); ++i) {
    for (int64_t p = from[i]; p < to[i]; ++p) r.ids.push_back(seqs[i][size_t(p)]);
    r.pos0.push_back(int32_t(from[i]));
    r.row_start.push_back(int32_t(r.ids.size()));
    r.logit_rows.push_back(r.row_start.back() - 1);
  }
  return r;
}

// The message of the Error f throws ("" when it throws none).
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A fixture model on the CPU backend with `ctx_size` tokens of KV cache and no tokenizer.
inline std::unique_ptr<Engine> load_cpu_engine(const std::string& model, QuantChoice quant, int64_t ctx_size) {
  LoadOptions o;
  o.model_dir = model_dir(model);
  o.device = DeviceChoice::CPU;
  o.quant = quant;
  o.ctx_size = ctx_size;
  o.load_tokenizer = false;
  return Engine::load(o);
}

// A golden file: NAME.golden.safetensors with f32/i32 tensors.
class Golden {
 public:
  explicit Golden(const std::string& model) : st_(fixture("models/" + model + ".golden.safetensors")) {}
  std::vector<float> f32(const std::string& name) const {
    const TensorInfo& t = get(name);
    std::vector<float> v(t.numel());
    std::memcpy(v.data(), t.data, t.nbytes);
    return v;
  }
  std::vector<int32_t> i32(const std::string& name) const {
    const TensorInfo& t = get(name);
    std::vector<int32_t> v(t.numel());
    std::memcpy(v.data(), t.data, t.nbytes);
    return v;
  }
  std::vector<int64_t> shape(const std::string& name) const { return get(name).shape; }

 private:
  const TensorInfo& get(const std::string& name) const {
    const TensorInfo* t = st_.find(name);
    if (!t) fail("golden tensor ", name, " missing");
    return *t;
  }
  SafetensorsFile st_;
};

// ||a - b|| / ||b||
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(num / std::max(den, 1e-30));
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// How many representable float32 values lie between a and b (same-signed values).
inline int64_t ulp_diff(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::llabs(static_cast<int64_t>(ia) - static_cast<int64_t>(ib));
}

inline std::vector<float> flatten(const std::vector<std::vector<float>>& rows, size_t first = 0) {
  std::vector<float> out;
  for (size_t i = first; i < rows.size(); ++i) out.insert(out.end(), rows[i].begin(), rows[i].end());
  return out;
}

// ---- files and folders -------------------------------------------------------------------------

// The whole file as bytes ("" when it cannot be opened).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// A fresh, empty folder under the system's temporary directory (named PREFIX_XXXXXX), removed with
// everything in it when the TempDir goes out of scope.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "nf4flash_test") {
    std::string t = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed for " + t);
    path = t;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The path of `name` inside the folder, as a string.
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  // Writes `text` to the file `name` inside the folder (binary, replacing it) and returns its path.
  std::filesystem::path file(const std::string& name, const std::string& text) const {
    const std::filesystem::path p = path / name;
    std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
    return p;
  }

  std::filesystem::path path;
};

// ---- running the nf4flash binary -----------------------------------------------------------------

struct CliResult {
  int code = -1;  // exit status; -1 when the process did not exit normally
  std::string out, err;
};

// Runs `BIN ARGS` through the shell (ARGS quoted by the caller) with `stdin_text` on its standard
// input and `env` (optional) variable assignments, e.g. "NF4FLASH_PDL=0"; returns the exit status
// and everything it wrote to stdout and stderr.
inline CliResult run_program(const std::string& bin, const std::string& args, const std::string& stdin_text = "",
                             const std::string& env = "") {
  const TempDir io("nf4flash_cli");
  const std::string in = io / "stdin", err = io / "stderr";
  std::ofstream(in, std::ios::binary) << stdin_text;
  const std::string cmd =
      (env.empty() ? "" : "env " + env + " ") + "'" + bin + "' " + args + " <'" + in + "' 2>'" + err + "'";
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err);
  return r;
}

// The nf4flash binary the build made.
inline CliResult run_cli(const std::string& args, const std::string& stdin_text = "", const std::string& env = "") {
  return run_program(NF4FLASH_BIN, args, stdin_text, env);
}

// The number of newline characters in s.
inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// ---- scoped backend tuning (tests set the tuning struct, not the environment) ----
// The default CudaTuning with `edit` applied: for CudaBackendOptions::tuning, or for
// ScopedCudaTuning (backend/cuda_tuning.h) where the engine creates the backend.
inline CudaTuning tuning_with(const std::function<void(CudaTuning&)>& edit) {
  CudaTuning t;
  edit(t);
  return t;
}

}  // namespace nf4flash::test
