// nf4flash batch: a JSONL file of requests through the batched engine (runtime/batch_runner.h),
// each result appended to the output as it finishes; a rerun with the same output skips the ids
// done. File formats: src/batch/batch_jobs.h.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "batch/batch_jobs.h"
#include "chat/chat_template.h"
#include "commands.h"
#include "core/error.h"
#include "model_flags.h"
#include "runtime/batch_runner.h"
#include "runtime/stop_text.h"
#include "text_io.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash::cli {
namespace {

struct BatchArgs {
  ModelFlags model;
  SamplingFlags sampling;
  std::string input, output;
  int max_batch = 16, block_size = 16;
  int64_t step_tokens = 512;
  bool skip_bad_lines = false;
};

// The request's prompt ids: raw text with the tokenizer's special tokens, or the chat messages
// through the model's template (which writes BOS itself).
std::vector<int32_t> prompt_ids(const Engine& e, const BatchJob& j) {
  if (j.prompt) return encode_text(e, *j.prompt, true);
  if (!e.chat_template())
    fail("\"messages\" need a chat template: ",
         e.chat_template_error().empty() ? "none found in tokenizer_config.json" : e.chat_template_error());
  const std::string rendered = e.chat_template()->apply(j.messages, true);
  return e.tokenizer()->encode(rendered, false);
}

GenerateOptions request_options(const GenerateOptions& dflt, const BatchJob& j) {
  GenerateOptions g = dflt;
  if (j.max_new_tokens) g.max_new_tokens = *j.max_new_tokens;
  if (j.temperature) g.sampling.temperature = *j.temperature;
  if (j.top_p) g.sampling.top_p = *j.top_p;
  if (j.top_k) g.sampling.top_k = *j.top_k;
  if (j.min_p) g.sampling.min_p = *j.min_p;
  if (j.seed) g.sampling.seed = *j.seed;
  g.reuse_cache = false;
  return g;
}

// A running request and its text (stop strings matched as it is generated).
struct Running {
  Running(const BatchJob& j, const Tokenizer& tok) : job(&j), text(tok, j.stop) {}
  const BatchJob* job;
  StopText text;
};

int run_batch(const BatchArgs& a) {
  const BatchJobFile f = read_batch_jobs(a.input);
  for (const BatchLineError& e : f.errors) std::fprintf(stderr, "%s:%lld: %s\n", a.input.c_str(), (long long)e.line, e.message.c_str());
  if (!f.errors.empty() && !a.skip_bad_lines)
    fail(a.input, ": ", f.errors.size(), " bad line(s) (listed above); fix them or pass --skip-bad-lines");
  const std::set<std::string> done = read_done_ids(a.output);
  std::vector<const BatchJob*> todo;
  for (const BatchJob& j : f.jobs)
    if (!done.count(j.id)) todo.push_back(&j);
  if (!a.model.quiet)
    std::fprintf(stderr, "batch: %zu requests, %zu done already, %zu to run\n", f.jobs.size(), f.jobs.size() - todo.size(),
                 todo.size());
  BatchResultWriter out(a.output);
  if (todo.empty()) return 0;
  auto engine = load_engine(a.model);
  const Tokenizer* tok = engine->tokenizer();
  if (!tok) fail(a.model.model, ": batch needs the model's tokenizer.json (requests are text)");

  std::map<int64_t, Running> running;
  BatchRunnerOptions o;
  o.block_size = a.block_size;
  o.sched.max_seqs_per_step = a.max_batch;
  o.sched.max_tokens_per_step = std::max<int64_t>(a.step_tokens, a.max_batch);
  o.sched.max_context = INT64_MAX / 4;  // the engine's context size caps it
  o.on_token = [&](int64_t id, int32_t t) {
    Running& r = running.at(id);
    return r.job->stop.empty() || !r.text.push(t);
  };
  BatchRunner runner(*engine, o);
  const GenerateOptions dflt = a.sampling.to_options();
  int64_t n_done = 0, n_tokens = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    const BatchJob& j = *todo[i];
    BatchResult res;
    res.id = j.id;
    try {
      BatchRequest r{int64_t(i), prompt_ids(*engine, j), request_options(dflt, j)};
      running.try_emplace(int64_t(i), j, *tok);
      const SubmitResult s = runner.submit(std::move(r));
      if (s.status == SubmitResult::Status::Rejected) {
        running.erase(int64_t(i));
        res.error = s.error;
      }
    } catch (const Error& e) {
      running.erase(int64_t(i));
      res.error = e.what();
    }
    if (!res.error.empty()) {
      std::fprintf(stderr, "batch: request %s (line %lld): %s\n", j.id.c_str(), (long long)j.line, res.error.c_str());
      out.write(res);
      ++n_done;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto last = t0;
  while (runner.has_work()) {
    for (BatchOutput& b : runner.step()) {
      Running& r = running.at(b.id);
      BatchResult res;
      res.id = r.job->id;
      res.text = r.text.stopped() ? r.text.text() : tok->decode(b.tokens, true);
      res.completion_tokens = int64_t(b.tokens.size());
      res.prompt_tokens = b.prompt_tokens;
      res.finish_reason = b.finish_reason;
      out.write(res);
      n_tokens += res.completion_tokens;
      ++n_done;
      running.erase(b.id);
    }
    const auto now = std::chrono::steady_clock::now();
    if (!a.model.quiet && (now - last > std::chrono::seconds(1) || !runner.has_work())) {
      const double s = std::chrono::duration<double>(now - t0).count();
      const double rate = s > 0 ? double(n_done) / s : 0;
      std::fprintf(stderr, "batch: %lld/%zu done | %.1f tok/s | ETA %.0f s\n", (long long)n_done, todo.size(),
                   s > 0 ? double(n_tokens) / s : 0.0, rate > 0 ? double(int64_t(todo.size()) - n_done) / rate : 0.0);
      last = now;
    }
  }
  return 0;
}

NF4FLASH_COMMAND("batch", "Run a JSONL file of requests through the batched engine, appending results as they finish",
                 [](CLI::App& app) -> CommandRun {
  auto a = std::make_shared<BatchArgs>();
  a->model.add(app);
  a->sampling.add(app);
  app.add_option("--input,-i", a->input, "JSONL requests: id, prompt or messages, optional max_new_tokens, "
                 "temperature, top_p, top_k, min_p, seed, stop")->required();
  app.add_option("--output,-o", a->output, "JSONL results, appended as each finishes; a rerun skips the ids in it")
      ->required();
  app.add_option("--max-batch", a->max_batch, "most sequences in one step")->check(CLI::Range(1, 1024));
  app.add_option("--step-tokens", a->step_tokens, "most tokens in one step (prefill chunks share it with decodes)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  app.add_option("--block-size", a->block_size, "positions per KV cache block")->check(CLI::Range(1, 4096));
  app.add_flag("--skip-bad-lines", a->skip_bad_lines, "report bad input lines and run the others (default: refuse the file)");
  return [a] { return run_batch(*a); };
});

}  // namespace
}  // namespace nf4flash::cli
