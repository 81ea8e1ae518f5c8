// `nf4flash tokenize`: text to token ids with a model folder's tokenizer.json (or a given file),
// ids back to text with --decode, a throughput benchmark with --bench-seconds, and a batch mode
// (--batch-file, a JSON array of strings) used by the differential test against HF tokenizers.
#include <chrono>
#include <ctime>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash::cli {
namespace {

struct TokenizeOpts {
  std::string model, tokenizer, config, text, text_file, batch_file;
  bool has_text = false, add_special = false, json = false, decode = false, skip_special = false;
  double bench_seconds = 0;
  int threads = 0;
};

std::string ids_csv(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ids[i]);
  }
  return s;
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Encodes the whole text repeatedly for --bench-seconds; reports MB/s per wall second and per CPU
// second (the latter is robust when the machine is shared), single-threaded, then on all threads.
int run_bench(const Tokenizer& tok, const std::string& text, const TokenizeOpts& o) {
  using clock = std::chrono::steady_clock;
  struct Result {
    size_t iters = 0, tokens = 0;
    double wall = 0, cpu = 0;
  };
  auto measure = [&](bool parallel) {
    Result r;
    auto t0 = clock::now();
    double c0 = cpu_seconds();
    do {
      auto ids = parallel ? tok.encode(text, o.add_special) : tok.encode_single_thread(text, o.add_special);
      r.tokens = ids.size();
      ++r.iters;
      r.wall = std::chrono::duration<double>(clock::now() - t0).count();
    } while (r.wall < o.bench_seconds);
    r.cpu = cpu_seconds() - c0;
    return r;
  };
  tok.encode_single_thread(text, o.add_special);  // warm-up (fills the word cache like any real run)
  Result one = measure(false), par = measure(true);
  double mb = double(text.size()) / 1e6;
  nlohmann::json j = {{"bytes", text.size()},
                      {"tokens", one.tokens},
                      {"iterations", one.iters},
                      {"seconds", one.wall},
                      {"cpu_seconds", one.cpu},
                      {"mb_per_s", mb * double(one.iters) / one.wall},
                      {"mb_per_cpu_s", mb * double(one.iters) / one.cpu},
                      {"threads_parallel", num_threads()},
                      {"mb_per_s_parallel", mb * double(par.iters) / par.wall},
                      {"parallel_matches", par.tokens == one.tokens}};
  std::printf("%s\n", dump(j).c_str());
  return 0;
}

int run_batch(const Tokenizer& tok, const TokenizeOpts& o) {
  nlohmann::json in;
  try {
    in = nlohmann::json::parse(read_text_file(o.batch_file));
  } catch (const nlohmann::json::exception& e) {
    fail(o.batch_file, ": invalid JSON: ", e.what());
  }
  if (!in.is_array()) fail(o.batch_file, ": expected a JSON array of strings");
  std::vector<std::string> texts;
  for (const auto& t : in) {
    if (!t.is_string()) fail(o.batch_file, ": expected a JSON array of strings");
    texts.push_back(t.get<std::string>());
  }
  auto ids = tok.encode_batch(texts, false, o.threads);
  auto ids_sp = tok.encode_batch(texts, true, o.threads);
  nlohmann::json out = {{"ids", nlohmann::json::array()}, {"ids_with_special", nlohmann::json::array()},
                        {"decoded", nlohmann::json::array()}};
  for (size_t i = 0; i < texts.size(); ++i) {
    out["ids"].push_back(ids[i]);
    out["ids_with_special"].push_back(ids_sp[i]);
    out["decoded"].push_back(tok.decode(ids[i], false));
  }
  std::printf("%s\n", dump(out).c_str());
  return 0;
}

CommandRun setup(CLI::App& app) {
  auto o = std::make_shared<TokenizeOpts>();
  auto* model = app.add_option("--model", o->model, "model folder with tokenizer.json (+ tokenizer_config.json)");
  auto* tokf = app.add_option("--tokenizer", o->tokenizer, "a tokenizer.json file");
  model->excludes(tokf);
  app.add_option("--config", o->config, "tokenizer_config.json to use with --tokenizer")->needs(tokf);
  auto* text = app.add_option("--text", o->text, "the text (or, with --decode, comma-separated ids)");
  auto* tf = app.add_option("--text-file", o->text_file, "read the text from a file");
  auto* bf = app.add_option("--batch-file", o->batch_file,
                            "JSON array of strings: print {ids, ids_with_special, decoded} for each");
  text->excludes(tf)->excludes(bf);
  tf->excludes(bf);
  app.add_flag("--add-special-tokens", o->add_special, "apply the post-processor (e.g. BOS)");
  app.add_flag("--json", o->json, "print {\"ids\": [...]} (with --decode: {\"text\": ...})");
  app.add_flag("--decode", o->decode, "the input is token ids; print the decoded text");
  app.add_flag("--skip-special-tokens", o->skip_special, "with --decode: drop special tokens");
  app.add_option("--bench-seconds", o->bench_seconds, "benchmark encoding for S seconds; print MB/s as JSON")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o->threads, "threads for batches and long inputs (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  return [o, text]() -> int {
    if (o->model.empty() && o->tokenizer.empty()) fail("tokenize: one of --model or --tokenizer is required");
    if (o->threads > 0) set_num_threads(o->threads);
    auto tok = o->model.empty() ? Tokenizer::from_files(o->tokenizer, o->config) : Tokenizer::from_dir(o->model);
    if (!o->batch_file.empty()) return run_batch(*tok, *o);
    if (text->count() == 0 && o->text_file.empty())
      fail("tokenize: one of --text, --text-file or --batch-file is required");
    std::string input = o->text_file.empty() ? o->text : read_text_file(o->text_file);
    if (o->decode) {
      auto ids = parse_id_list(input, o->text_file.empty() ? "--text" : o->text_file);
      for (int32_t id : ids)
        if (id >= tok->vocab_size()) fail("--decode: id ", id, " is outside the vocabulary (size ", tok->vocab_size(), ")");
      std::string s = tok->decode(ids, o->skip_special);
      if (o->json) std::printf("%s\n", dump(nlohmann::json{{"text", s}}).c_str());
      else std::printf("%s\n", s.c_str());
      return 0;
    }
    if (o->bench_seconds > 0) return run_bench(*tok, input, *o);
    auto ids = tok->encode(input, o->add_special);
    if (o->json) std::printf("%s\n", dump(nlohmann::json{{"ids", ids}}).c_str());
    else std::printf("%s\n", ids_csv(ids).c_str());
    return 0;
  };
}

NF4FLASH_COMMAND("tokenize", "text to token ids (or ids to text with --decode) with a Hugging Face tokenizer", setup);

}  // namespace
}  // namespace nf4flash::cli
