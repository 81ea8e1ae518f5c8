// The files of a batch run (`nf4flash batch`): the JSONL input, one request a line, and the JSONL
// results, one line a finished request, appended and flushed as each finishes so that a rerun with
// the same output skips what is done and nothing finished is lost when a run is interrupted.
//
// Input line: {"id": "a1" (string or integer), "prompt": "text" | "messages": [{"role", "content"}...],
//              optional "max_new_tokens" (int >= 0), "temperature" (>= 0), "top_p" (0 < p <= 1),
//              "top_k" (int >= 0), "min_p" (0 <= p <= 1), "seed" (int >= 0),
//              "stop" (string or list of up to kMaxStops non-empty strings)}
// Any other field, a wrong type or value, a missing id, both or neither of prompt and messages,
// or an id seen on an earlier line is an error of that line (line numbers from 1; blank lines are
// skipped).
// Result line: {"id", "text", "completion_tokens", "prompt_tokens", "finish_reason"} (finish_reason
// "stop" for EOS or a stop string, "length" for max_new_tokens), or, for a request that failed,
// {"id", "error"}.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace nf4flash {

constexpr int kMaxStops = 16;

struct BatchJob {
  std::string id;
  int64_t line = 0;                   // 1-based line of the input file
  std::optional<std::string> prompt;  // raw text, or
  nlohmann::json messages;            // the chat messages (an array) when no prompt
  std::optional<int> max_new_tokens, top_k;
  std::optional<float> temperature, top_p, min_p;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
};

struct BatchLineError {
  int64_t line = 0;
  std::string message;  // names the field and what is wrong
};

struct BatchJobFile {
  std::vector<BatchJob> jobs;           // in input order
  std::vector<BatchLineError> errors;   // the bad lines, in input order
};

// One input line (text without its newline) as a job; throws Error naming the field at fault.
BatchJob parse_batch_job(const std::string& text, int64_t line);
// The whole input file; a file that cannot be opened throws Error naming it. Bad lines and
// duplicate ids become errors (the caller decides whether one is fatal).
BatchJobFile read_batch_jobs(const std::string& path);

// The ids that already have a result line in `path` (none when it does not exist). A last line
// without its newline (a write cut short) does not count.
std::set<std::string> read_done_ids(const std::string& path);

struct BatchResult {
  std::string id;
  std::string text;
  int64_t completion_tokens = 0, prompt_tokens = 0;
  std::string finish_reason;  // "stop" | "length"
  std::string error;          // non-empty: the request failed with this message (only id and error are written)
};
nlohmann::json batch_result_json(const BatchResult& r);

// Appends result lines to a file, each written and flushed whole. Opening cuts a partial last line
// left by an interrupted run (its request is run again).
class BatchResultWriter {
 public:
  explicit BatchResultWriter(const std::string& path);
  ~BatchResultWriter();
  BatchResultWriter(const BatchResultWriter&) = delete;
  BatchResultWriter& operator=(const BatchResultWriter&) = delete;
  void write(const BatchResult& r);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace nf4flash
