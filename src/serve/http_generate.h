// The generation routes of `nf4flash serve` (POST /v1/chat/completions and /v1/completions): body
// to prompt ids and generation options, n sequences submitted to the ServeEngine, the reply as one
// JSON object or as server-sent events in OpenAI's chunk format ending with `data: [DONE]`.
#pragma once
#include <httplib.h>

#include "nf4flash/engine.h"
#include "serve/http_server.h"
#include "serve/openai_request.h"
#include "serve/serve_engine.h"

namespace nf4flash::serve {

struct GenerateContext {
  Engine& engine;
  ServeEngine& serve;
  const HttpOptions& opt;
};

void handle_generate(const GenerateContext& c, const httplib::Request& req, httplib::Response& res, Endpoint ep);
void send_error(httplib::Response& res, const ApiError& e);

}  // namespace nf4flash::serve
