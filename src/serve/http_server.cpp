// HttpServer (http_server.h): routes, API key, error JSON, request log; the generation routes live
// in http_generate.cpp.
#include "serve/http_server.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <ctime>

#include "core/error.h"
#include "serve/http_generate.h"
#include "serve/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash::serve {

using nlohmann::json;

struct HttpServer::Impl {
  Engine& engine;
  ServeEngine& serve;
  Metrics& metrics;
  HttpOptions opt;
  httplib::Server svr;
  std::atomic<bool>* draining = nullptr;
  Impl(Engine& e, ServeEngine& s, Metrics& m, const HttpOptions& o) : engine(e), serve(s), metrics(m), opt(o) {}
};

namespace {

const char* status_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string endpoint_label(const std::string& path) {
  static const char* known[] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                                "/tokenize", "/detokenize"};
  for (const char* k : known)
    if (path == k) return k;
  return "other";
}

}  // namespace

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(json_text(e.to_json()), "application/json");
}

HttpServer::HttpServer(Engine& engine, ServeEngine& serve, Metrics& metrics, const HttpOptions& o)
    : impl_(std::make_unique<Impl>(engine, serve, metrics, o)) {
  Impl& m = *impl_;
  m.draining = &draining_;
  httplib::Server& svr = m.svr;
  const int threads = std::max(o.http_threads, 4);
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  svr.set_payload_max_length(o.max_body_bytes);
  svr.set_keep_alive_timeout(30);

  svr.set_pre_routing_handler([&m](const httplib::Request& req, httplib::Response& res) {
    if (m.opt.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + m.opt.api_key) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = 401;
    e.type = "authentication_error";
    e.code = "invalid_api_key";
    e.message = auth.empty() ? "no API key: send the header 'Authorization: Bearer KEY'" : "invalid API key";
    send_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  // statuses the library sets itself (404 unknown path, 413 body too large, 400 bad HTTP) get a body
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.status = res.status;
    e.type = status_type(res.status);
    if (res.status == 404) e.message = "unknown path " + req.method + " " + req.path;
    else if (res.status == 413) e.message = "the request body is too large";
    else e.message = cat("HTTP status ", res.status);
    send_error(res, e);
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    ApiError e;
    e.status = 500;
    e.type = "server_error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& x) {
      e.message = x.what();
    } catch (...) {
      e.message = "internal error";
    }
    send_error(res, e);
  });
  svr.set_logger([&m](const httplib::Request& req, const httplib::Response& res) {
    m.metrics.request(endpoint_label(req.path), res.status);
    if (!m.opt.log_requests) return;
    std::fprintf(stderr, "serve: %s %s %d %zu bytes\n", req.method.c_str(), req.path.c_str(), res.status,
                 res.body.size());
  });

  svr.Get("/health", [&m](const httplib::Request&, httplib::Response& res) {
    const bool draining = m.draining->load();
    res.status = draining ? 503 : 200;
    res.set_content(json_text(json{{"status", draining ? "shutting down" : "ok"}}), "application/json");
  });
  svr.Get("/metrics", [&m](const httplib::Request&, httplib::Response& res) {
    res.set_content(m.metrics.prometheus(), "text/plain; version=0.0.4");
  });
  svr.Get("/v1/models", [&m](const httplib::Request&, httplib::Response& res) {
    static const int64_t created = int64_t(std::time(nullptr));
    json d = {{"id", m.opt.model_id}, {"object", "model"}, {"created", created}, {"owned_by", "nf4flash"},
              {"max_model_len", m.serve.context_size()}};
    res.set_content(json_text(json{{"object", "list"}, {"data", json::array({d})}}), "application/json");
  });
  svr.Post("/tokenize", [&m](const httplib::Request& req, httplib::Response& res) {
    TokenizeRequest t;
    if (auto e = parse_tokenize(req.body, &t)) return send_error(res, *e);
    const std::vector<int32_t> ids = m.engine.tokenizer()->encode(t.content, t.add_special);
    res.set_content(json_text(json{{"tokens", ids}}), "application/json");
  });
  svr.Post("/detokenize", [&m](const httplib::Request& req, httplib::Response& res) {
    std::vector<int32_t> ids;
    if (auto e = parse_detokenize(req.body, &ids)) return send_error(res, *e);
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] >= m.engine.vocab_size()) {
        ApiError e;
        e.param = "tokens";
        e.message = cat("'tokens[", i, "]' is ", ids[i], ", outside the vocabulary (", m.engine.vocab_size(), " ids)");
        return send_error(res, e);
      }
    res.set_content(json_text(json{{"content", m.engine.tokenizer()->decode(ids, false)}}), "application/json");
  });
  GenerateContext ctx{m.engine, m.serve, m.opt};
  svr.Post("/v1/chat/completions", [ctx](const httplib::Request& req, httplib::Response& res) {
    handle_generate(ctx, req, res, Endpoint::Chat);
  });
  svr.Post("/v1/completions", [ctx](const httplib::Request& req, httplib::Response& res) {
    handle_generate(ctx, req, res, Endpoint::Completion);
  });
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  Impl& m = *impl_;
  if (m.opt.port == 0) {
    const int p = m.svr.bind_to_any_port(m.opt.host);
    NF4FLASH_CHECK(p > 0, "serve: cannot bind ", m.opt.host, " (any port)");
    return p;
  }
  NF4FLASH_CHECK(m.svr.bind_to_port(m.opt.host, m.opt.port), "serve: cannot bind ", m.opt.host, ":", m.opt.port,
                 " (in use, or not an address of this host)");
  return m.opt.port;
}

void HttpServer::listen() { impl_->svr.listen_after_bind(); }

void HttpServer::stop() { impl_->svr.stop(); }

}  // namespace nf4flash::serve
