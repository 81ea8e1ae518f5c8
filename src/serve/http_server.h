// The HTTP side of `nf4flash serve` (cpp-httplib): OpenAI-compatible routes over a ServeEngine.
//   POST /v1/chat/completions   chat template of the model, stream (SSE) or not, n choices
//   POST /v1/completions        raw prompt (text or token ids)
//   GET  /v1/models             the one model served
//   GET  /health                200 {"status":"ok"}, 503 while shutting down (readiness)
//   GET  /metrics               Prometheus text (serve_metrics.h)
//   POST /tokenize, /detokenize
// Every error is OpenAI's error JSON with its status: 400 bad body/fields/context, 401 key, 404
// path, 413 body too large, 429 queue full (Retry-After), 503 shutting down. With an API key every
// route but /health needs `Authorization: Bearer KEY`. One log line per request on stderr.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "nf4flash/engine.h"
#include "serve/serve_engine.h"
#include "serve/serve_metrics.h"

namespace nf4flash::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;              // 0: any free port (bound_port() tells which)
  std::string api_key;          // empty: no key needed
  size_t max_body_bytes = size_t(4) << 20;
  int http_threads = 40;        // connections served at once (a streaming client holds one)
  std::string model_id;         // the name /v1/models reports and replies carry
  int64_t default_max_tokens = 0;  // max_tokens when a request leaves it unset (0: up to the context)
  SamplingParams default_sampling;  // fields a request leaves unset
  bool ignore_eos = false;          // every request generates max_tokens (benchmarks)
  bool log_requests = true;
};

class HttpServer {
 public:
  HttpServer(Engine& engine, ServeEngine& serve, Metrics& metrics, const HttpOptions& o);
  ~HttpServer();
  // Binds (Error naming host:port when it cannot); returns the port.
  int bind();
  // Serves until stop() (blocking).
  void listen();
  void stop();
  // /health answers 503 from now on (drain before shutdown).
  void set_draining() { draining_ = true; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> draining_{false};
};

}  // namespace nf4flash::serve
