// nf4flash serve: an OpenAI-compatible HTTP server on the batched engine (src/serve/). SIGINT and
// SIGTERM stop accepting requests (/health answers 503), let in-flight ones finish for up to
// --shutdown-grace seconds, cancel what is left and exit 0.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "commands.h"
#include "core/error.h"
#include "model_flags.h"
#include "serve/http_server.h"
#include "serve/serve_engine.h"

namespace nf4flash::cli {
namespace {

std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) { g_signal = sig; }

struct ServeArgs {
  ModelFlags model;
  SamplingFlags sampling;
  serve::ServeOptions engine;
  serve::HttpOptions http;
  std::string api_key_file, preset, tokenizer;
  double max_body_mb = 4;
  int shutdown_grace = 30;
  bool no_log = false;
};

int run_serve(ServeArgs& a, bool max_tokens_given) {
  if (!a.api_key_file.empty()) {
    NF4FLASH_CHECK(a.http.api_key.empty(), "serve: give --api-key or --api-key-file, not both");
    std::string k = read_text_file(a.api_key_file);
    while (!k.empty() && (k.back() == '\n' || k.back() == '\r' || k.back() == ' ')) k.pop_back();
    NF4FLASH_CHECK(!k.empty(), "--api-key-file ", a.api_key_file, ": the file is empty");
    a.http.api_key = k;
  }
  NF4FLASH_CHECK(a.preset.empty() != a.model.model.empty(), "serve: give exactly one of --model DIR or --preset NAME");
  NF4FLASH_CHECK(a.preset.empty() || !a.tokenizer.empty(),
                 "serve --preset: a synthetic model has no tokenizer; give --tokenizer DIR (a folder with tokenizer.json)");
  NF4FLASH_CHECK(a.tokenizer.empty() || !a.preset.empty(), "serve: --tokenizer goes with --preset (a model folder has its own)");
  if (a.http.model_id.empty() && !a.preset.empty()) a.http.model_id = a.preset;
  if (a.http.model_id.empty()) a.http.model_id = std::filesystem::path(a.model.model).filename().string();
  if (a.http.model_id.empty()) a.http.model_id = std::filesystem::path(a.model.model).parent_path().filename().string();
  a.http.max_body_bytes = size_t(a.max_body_mb * 1024 * 1024);
  const GenerateOptions g = a.sampling.to_options();
  a.http.default_sampling = g.sampling;
  a.http.default_max_tokens = max_tokens_given ? g.max_new_tokens : 0;
  a.http.ignore_eos = g.ignore_eos;
  a.http.log_requests = !a.no_log;

  std::unique_ptr<Engine> engine;
  if (a.preset.empty()) {
    engine = load_engine(a.model);
  } else {
    LoadOptions o = a.model.to_options();
    o.tokenizer_dir = a.tokenizer;
    engine = Engine::load_preset(a.preset, o);
    if (!a.model.quiet) std::fprintf(stderr, "%s\n", describe_load(*engine).c_str());
  }
  NF4FLASH_CHECK(engine->tokenizer(), a.model.model, ": serve needs the model's tokenizer.json");
  serve::Metrics metrics;
  serve::ServeEngine se(*engine, a.engine, metrics);
  serve::HttpServer http(*engine, se, metrics, a.http);
  const int port = http.bind();
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  std::thread listener([&] { http.listen(); });
  std::fprintf(stderr, "nf4flash serve: %s on http://%s:%d (model id \"%s\", context %lld, batch %d%s)\n",
               a.preset.empty() ? a.model.model.c_str() : ("preset " + a.preset).c_str(), a.http.host.c_str(), port, a.http.model_id.c_str(),
               (long long)se.context_size(), a.engine.max_batch, a.http.api_key.empty() ? "" : ", API key required");
  std::fflush(stderr);
  while (g_signal == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::fprintf(stderr, "nf4flash serve: signal %d: no new requests; %lld in flight\n", g_signal.load(),
               (long long)se.in_flight());
  http.set_draining();
  se.stop_accepting();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.shutdown_grace);
  while (se.in_flight() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (se.in_flight() > 0) {
    std::fprintf(stderr, "nf4flash serve: cancelling %lld requests still running\n", (long long)se.in_flight());
    se.cancel_all();
    const auto d2 = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (se.in_flight() > 0 && std::chrono::steady_clock::now() < d2)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the last replies reach their clients
  http.stop();
  listener.join();
  std::fprintf(stderr, "nf4flash serve: stopped\n");
  return 0;
}

CommandRun setup_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  a->model.add(app, false);
  a->sampling.add(app);
  app.add_option("--preset", a->preset,
                 "a synthetic model built in memory instead of --model (benchmarks: llama3-8b, ...), with --tokenizer");
  app.add_option("--tokenizer", a->tokenizer, "with --preset: the folder whose tokenizer.json and chat template to use");
  app.add_option("--host", a->http.host, "address to listen on (loopback by default)")->capture_default_str();
  app.add_option("--port", a->http.port, "TCP port (0: any free port, printed at start)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--api-key", a->http.api_key, "require 'Authorization: Bearer KEY' on every route but /health");
  app.add_option("--api-key-file", a->api_key_file, "read the API key from this file");
  app.add_option("--model-id", a->http.model_id, "the model name /v1/models reports (default: the folder's name)");
  app.add_option("--max-batch", a->engine.max_batch, "most sequences in one step")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app.add_option("--step-tokens", a->engine.step_tokens, "most tokens in one step (prompt chunks share it with decodes)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  app.add_option("--block-size", a->engine.block_size, "positions per KV cache block")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--kv-blocks", a->engine.n_blocks, "KV cache blocks (0: every slot's whole context, capped by memory)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 30));
  app.add_option("--max-waiting", a->engine.max_waiting, "requests waiting for a slot before new ones get 429")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-body-mb", a->max_body_mb, "largest request body (MiB; more: 413)")
      ->check(CLI::Range(0.001, 1024.0))
      ->capture_default_str();
  app.add_option("--http-threads", a->http.http_threads, "connections served at once (a streaming client holds one)")
      ->check(CLI::Range(4, 4096))
      ->capture_default_str();
  app.add_option("--shutdown-grace", a->shutdown_grace, "seconds in-flight requests get to finish after SIGINT/SIGTERM")
      ->check(CLI::Range(0, 3600))
      ->capture_default_str();
  app.add_flag("--no-log", a->no_log, "no log line per request");
  CLI::Option* n_opt = app.get_option("--max-new-tokens");
  app.footer(
      "Defaults: sampling flags are the defaults of requests that leave a field unset; without -n a request's "
      "max_tokens defaults to the rest of the context. Point OpenAI clients at http://HOST:PORT/v1 (docs/serving.md).");
  return [a, n_opt] { return run_serve(*a, n_opt->count() > 0); };
}

NF4FLASH_COMMAND("serve", "Serve the model over an OpenAI-compatible HTTP API (chat, completions, streaming)",
                 setup_serve);

}  // namespace
}  // namespace nf4flash::cli
