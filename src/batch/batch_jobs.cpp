// The batch run's input and result files (batch_jobs.h): strict per-line parsing of the requests,
// the ids already done in a result file, and the appending writer that flushes each line whole.
#include "batch/batch_jobs.h"

#include <filesystem>
#include <fstream>
#include <string_view>

#include "core/error.h"

namespace nf4flash {

namespace {
using nlohmann::json;

std::string type_of(const json& v) {
  return v.is_string() ? "a string" : v.is_boolean() ? "a boolean" : v.is_number() ? "a number"
       : v.is_array() ? "a list" : v.is_object() ? "an object" : "null";
}

double number(const json& v, const char* field) {
  if (!v.is_number()) fail("\"", field, "\" must be a number, not ", type_of(v));
  return v.get<double>();
}

int64_t integer(const json& v, const char* field, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) fail("\"", field, "\" must be an integer, not ", v.is_number() ? "a fraction" : type_of(v));
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi) fail("\"", field, "\" is ", v.dump(), ": expected ", lo, "..", hi);
  return x;
}

float in_range(const json& v, const char* field, double lo, bool lo_open, double hi) {
  const double x = number(v, field);
  if (x < lo || (lo_open && x == lo) || x > hi)
    fail("\"", field, "\" is ", v.dump(), ": expected ", lo_open ? "(" : "[", lo, ", ", hi, "]");
  return float(x);
}
}  // namespace

BatchJob parse_batch_job(const std::string& text, int64_t line) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) fail("not valid JSON");
  if (!j.is_object()) fail("a request must be a JSON object, not ", type_of(j));
  BatchJob b;
  b.line = line;
  bool have_id = false;
  for (const auto& [k, v] : j.items()) {
    if (k == "id") {
      if (v.is_string() && !v.get<std::string>().empty()) b.id = v.get<std::string>();
      else if (v.is_number_integer()) b.id = v.dump();
      else fail("\"id\" must be a non-empty string or an integer, not ", type_of(v));
      have_id = true;
    } else if (k == "prompt") {
      if (!v.is_string()) fail("\"prompt\" must be a string, not ", type_of(v));
      b.prompt = v.get<std::string>();
    } else if (k == "messages") {
      if (!v.is_array() || v.empty()) fail("\"messages\" must be a non-empty list of {\"role\", \"content\"} objects");
      for (size_t i = 0; i < v.size(); ++i) {
        const json& m = v[i];
        if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
            !m["content"].is_string())
          fail("\"messages\"[", i, "] must be an object with string \"role\" and \"content\"");
      }
      b.messages = v;
    } else if (k == "max_new_tokens") {
      b.max_new_tokens = int(integer(v, "max_new_tokens", 0, 1 << 24));
    } else if (k == "top_k") {
      b.top_k = int(integer(v, "top_k", 0, 1 << 24));
    } else if (k == "seed") {
      b.seed = uint64_t(integer(v, "seed", 0, INT64_MAX));
    } else if (k == "temperature") {
      b.temperature = in_range(v, "temperature", 0.0, false, 100.0);
    } else if (k == "top_p") {
      b.top_p = in_range(v, "top_p", 0.0, true, 1.0);
    } else if (k == "min_p") {
      b.min_p = in_range(v, "min_p", 0.0, false, 1.0);
    } else if (k == "stop") {
      const json list = v.is_string() ? json::array({v}) : v;
      if (!list.is_array()) fail("\"stop\" must be a string or a list of strings, not ", type_of(v));
      if (list.size() > size_t(kMaxStops)) fail("\"stop\" has ", list.size(), " strings: at most ", kMaxStops);
      for (const json& s : list) {
        if (!s.is_string() || s.get<std::string>().empty()) fail("\"stop\" must hold non-empty strings");
        b.stop.push_back(s.get<std::string>());
      }
    } else {
      fail("unknown field \"", k, "\" (fields: id, prompt, messages, max_new_tokens, temperature, top_p, top_k, ",
           "min_p, seed, stop)");
    }
  }
  if (!have_id) fail("missing \"id\"");
  if (b.prompt && !b.messages.is_null()) fail("give \"prompt\" or \"messages\", not both");
  if (!b.prompt && b.messages.is_null()) fail("missing \"prompt\" (or \"messages\")");
  return b;
}

BatchJobFile read_batch_jobs(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot open the batch input");
  BatchJobFile f;
  std::set<std::string> ids;
  std::string text;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    try {
      BatchJob b = parse_batch_job(text, line);
      if (!ids.insert(b.id).second) fail("\"id\" ", b.id, " was used on an earlier line");
      f.jobs.push_back(std::move(b));
    } catch (const Error& e) {
      f.errors.push_back({line, e.what()});
    }
  }
  return f;
}

std::set<std::string> read_done_ids(const std::string& path) {
  std::set<std::string> done;
  std::ifstream in(path, std::ios::binary);
  if (!in) return done;
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  for (size_t nl; (nl = all.find('\n', pos)) != std::string::npos; pos = nl + 1) {  // whole lines only
    const json j = json::parse(std::string_view(all).substr(pos, nl - pos), nullptr, false);
    if (j.is_object() && j.contains("id") && j["id"].is_string()) done.insert(j["id"].get<std::string>());
  }
  return done;
}

json batch_result_json(const BatchResult& r) {
  if (!r.error.empty()) return json{{"id", r.id}, {"error", r.error}};
  return json{{"id", r.id},
              {"text", r.text},
              {"completion_tokens", r.completion_tokens},
              {"prompt_tokens", r.prompt_tokens},
              {"finish_reason", r.finish_reason}};
}

BatchResultWriter::BatchResultWriter(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(path, ec)) {  // cut a partial last line (a write cut short by an interrupted run)
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t keep = all.empty() || all.back() == '\n' ? all.size() : all.rfind('\n') + 1;  // npos + 1 == 0
    if (keep != all.size()) {
      fs::resize_file(path, keep, ec);
      if (ec) fail(path, ": cannot cut the partial last line: ", ec.message());
    }
  }
  f_ = std::fopen(path.c_str(), "ab");
  if (!f_) fail(path, ": cannot open the batch output for appending");
}

BatchResultWriter::~BatchResultWriter() {
  if (f_) std::fclose(f_);
}

void BatchResultWriter::write(const BatchResult& r) {
  // invalid UTF-8 in the text (a generation cut inside a character) becomes U+FFFD, not an error
  const std::string line = batch_result_json(r).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    fail(path_, ": cannot write a result line");
}

}  // namespace nf4flash
