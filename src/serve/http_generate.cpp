// POST /v1/chat/completions and /v1/completions (http_generate.h).
#include "serve/http_generate.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <random>

#include "chat/chat_template.h"
#include "core/error.h"
#include "serve/peer_socket.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash::serve {

using nlohmann::json;

namespace {

std::string new_id(Endpoint ep) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  char b[48];
  std::snprintf(b, sizeof b, "%s-%012llx", ep == Endpoint::Chat ? "chatcmpl" : "cmpl",
                (unsigned long long)((salt << 20) ^ ++counter) & 0xffffffffffffull);
  return b;
}

ApiError bad_request(const std::string& message, const std::string& param = "", const std::string& code = "") {
  ApiError e;
  e.message = message;
  e.param = param;
  e.code = code;
  return e;
}

// The prompt ids of a request; an ApiError when the template or the ids are at fault.
std::vector<int32_t> prompt_ids(const GenerateContext& c, const GenRequest& r, std::optional<ApiError>* err) {
  const Tokenizer& tok = *c.engine.tokenizer();
  if (r.endpoint == Endpoint::Completion) {
    if (r.prompt) return tok.encode(*r.prompt, true);
    for (size_t i = 0; i < r.prompt_ids.size(); ++i)
      if (r.prompt_ids[i] >= c.engine.vocab_size()) {
        *err = bad_request(cat("'prompt[", i, "]' is ", r.prompt_ids[i], ", outside the vocabulary (",
                               c.engine.vocab_size(), " ids)"),
                           "prompt");
        return {};
      }
    return r.prompt_ids;
  }
  const ChatTemplate* t = c.engine.chat_template();
  if (!t) {
    *err = bad_request(cat("this model has no chat template (",
                           c.engine.chat_template_error().empty() ? "none in tokenizer_config.json"
                                                                  : c.engine.chat_template_error(),
                           "); use /v1/completions"),
                       "messages");
    return {};
  }
  try {
    return tok.encode(t->apply(r.messages, true), false);
  } catch (const Error& e) {
    *err = bad_request(cat("the chat template failed on these messages: ", e.what()), "messages");
    return {};
  }
}

json usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  return json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

// One submitted choice.
struct Choice {
  std::shared_ptr<SeqHandle> h;
  std::string text;
  std::string finish;  // set when finished
  int64_t tokens = 0, prompt_tokens = 0, cached = 0;
  bool role_sent = false;
  // log-probabilities of tokens not yet in a written chunk (stream) or of all tokens (non-stream)
  std::vector<int32_t> lp_ids;
  std::vector<TokenLogprobs> lps;
};

// The logprobs object of a choice for `ids`: chat {"content": [{token, logprob, bytes, top_logprobs}]},
// completions {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}.
json logprobs_json(const Tokenizer& tok, bool chat, const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& lps,
                   size_t text_offset) {
  auto text_of = [&](int32_t id) { return tok.token_text(id); };
  auto bytes_of = [](const std::string& t) {
    json b = json::array();
    for (unsigned char c : t) b.push_back(int(c));
    return b;
  };
  if (chat) {
    json content = json::array();
    for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
      const std::string t = text_of(ids[i]);
      json top = json::array();
      for (const auto& [id, lp] : lps[i].top) {
        const std::string tt = text_of(id);
        top.push_back({{"token", tt}, {"logprob", lp}, {"bytes", bytes_of(tt)}});
      }
      content.push_back({{"token", t}, {"logprob", lps[i].logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", top}});
    }
    return json{{"content", content}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (size_t i = 0; i < ids.size() && i < lps.size(); ++i) {
    const std::string t = text_of(ids[i]);
    tokens.push_back(t);
    token_lps.push_back(lps[i].logprob);
    json top = json::object();
    for (const auto& [id, lp] : lps[i].top) top[text_of(id)] = lp;
    tops.push_back(top);
    offsets.push_back(text_offset);
    text_offset += t.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// "stop" | "length" as OpenAI names them; "abort" (shutdown) and errors are not finishes a client knows.
bool client_finish(const std::string& f) { return f == "stop" || f == "length"; }

}  // namespace

void handle_generate(const GenerateContext& c, const httplib::Request& req, httplib::Response& res, Endpoint ep) {
  ParseResult p = parse_gen_request(req.body, ep);
  if (p.error) return send_error(res, *p.error);
  const GenRequest& r = *p.request;
  std::optional<ApiError> err;
  std::vector<int32_t> prompt = prompt_ids(c, r, &err);
  if (err) return send_error(res, *err);
  if (prompt.empty()) return send_error(res, bad_request("the prompt is empty", ep == Endpoint::Chat ? "messages" : "prompt"));
  const int64_t ctx = c.serve.context_size(), P = int64_t(prompt.size());
  if (P >= ctx)
    return send_error(res, bad_request(cat("the prompt has ", P, " tokens; this model's context is ", ctx, " tokens"),
                                       ep == Endpoint::Chat ? "messages" : "prompt", "context_length_exceeded"));
  int64_t max_tokens = ctx - P;
  if (c.opt.default_max_tokens > 0) max_tokens = std::min(max_tokens, c.opt.default_max_tokens);
  if (r.max_tokens) {
    if (P + *r.max_tokens > ctx)
      return send_error(res, bad_request(cat("'max_tokens' is ", *r.max_tokens, " but the prompt has ", P,
                                             " tokens and this model's context is ", ctx, " tokens"),
                                         "max_tokens", "context_length_exceeded"));
    max_tokens = *r.max_tokens;
  }
  GenerateOptions gen;
  gen.max_new_tokens = int(max_tokens);
  gen.sampling = merged_sampling(r, c.opt.default_sampling);
  if (!r.seed && !gen.sampling.greedy()) gen.sampling.seed = std::random_device{}();
  gen.reuse_cache = false;
  gen.ignore_eos = c.opt.ignore_eos;

  auto choices = std::make_shared<std::vector<Choice>>(size_t(r.n));
  for (int i = 0; i < r.n; ++i) {
    SubmitSpec s{prompt, gen, r.stop, r.logprobs ? r.top_logprobs : -1};
    s.gen.sampling.seed = gen.sampling.seed + uint64_t(i);
    ServeEngine::Submitted sub = c.serve.submit(std::move(s));
    if (!sub.handle) {
      for (Choice& ch : *choices)
        if (ch.h) ch.h->cancel();
      ApiError e = bad_request(sub.error);
      if (sub.refusal == ServeEngine::Refusal::QueueFull) {
        e.status = 429;
        e.type = "rate_limit_error";
        res.set_header("Retry-After", "1");
      } else if (sub.refusal == ServeEngine::Refusal::ShuttingDown) {
        e.status = 503;
        e.type = "service_unavailable";
        res.set_header("Retry-After", "5");
      } else if (sub.refusal == ServeEngine::Refusal::TooLong) {
        e.code = "context_length_exceeded";
      }
      return send_error(res, e);
    }
    (*choices)[size_t(i)].h = sub.handle;
  }
  const std::string id = new_id(ep);
  const int64_t created = int64_t(std::time(nullptr));
  const std::string model = r.model.empty() ? c.opt.model_id : r.model;
  const bool chat = ep == Endpoint::Chat;
  const int want_lp = r.logprobs ? r.top_logprobs : -1;
  auto apply = [want_lp](Choice& ch, const SeqEvent& e) {
    if (want_lp >= 0) {
      ch.lp_ids.insert(ch.lp_ids.end(), e.ids.begin(), e.ids.end());
      ch.lps.insert(ch.lps.end(), e.logprobs.begin(), e.logprobs.end());
    }
    ch.text += e.delta;
    ch.tokens = e.tokens;
    if (e.finished) {
      ch.finish = e.finish_reason;
      ch.prompt_tokens = e.prompt_tokens;
      ch.cached = e.cached_tokens;
    }
  };

  if (!r.stream) {
    // a client that goes away before the reply cancels every choice (its socket polled every 100 ms)
    const PeerSocket peer(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
    for (Choice& ch : *choices)
      while (ch.finish.empty()) {
        for (const SeqEvent& e : ch.h->wait(std::chrono::milliseconds(100))) apply(ch, e);
        if (ch.finish.empty() && peer.gone()) {
          for (Choice& other : *choices) other.h->cancel();
          res.status = 499;  // nginx's "client closed request": logged, never received
          return;
        }
      }
    json arr = json::array();
    int64_t completion = 0, cached = 0;
    for (size_t i = 0; i < choices->size(); ++i) {
      const Choice& ch = (*choices)[i];
      if (!client_finish(ch.finish)) {
        ApiError e = bad_request(ch.finish.rfind("error: ", 0) == 0 ? ch.finish.substr(7) : "the request was cancelled");
        if (ch.finish == "abort") {
          e.status = 503;
          e.type = "service_unavailable";
          e.message = "the server shut down before the request finished";
        }
        return send_error(res, e);
      }
      completion += ch.tokens;
      cached = std::max(cached, ch.cached);
      json o = {{"index", i}, {"finish_reason", ch.finish}, {"logprobs", nullptr}};
      if (want_lp >= 0) o["logprobs"] = logprobs_json(*c.engine.tokenizer(), chat, ch.lp_ids, ch.lps, 0);
      if (chat) o["message"] = {{"role", "assistant"}, {"content", ch.text}};
      else o["text"] = ch.text;
      arr.push_back(o);
    }
    json out = {{"id", id},           {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created}, {"model", model},
                {"choices", arr},     {"usage", usage_json(P, completion, cached)}};
    res.set_content(json_text(out), "application/json");
    return;
  }

  // streaming: one chunk per choice and delta, the finish chunk of each, the usage chunk when
  // asked, then [DONE]; a client that goes away cancels every choice
  const bool usage = r.include_usage;
  auto chunk = [id, created, model, chat](size_t i, const std::string& text, const json& finish, bool role,
                                          const json& lp = nullptr) {
    json ch = {{"index", i}, {"finish_reason", finish}, {"logprobs", lp}};
    if (chat) {
      json d = json::object();
      if (role) d["role"] = "assistant";
      if (!text.empty() || role) d["content"] = text;
      ch["delta"] = d;
    } else {
      ch["text"] = text;
    }
    json o = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
              {"model", model}, {"choices", json::array({ch})}};
    return "data: " + json_text(o) + "\n\n";
  };
  auto last_write = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  auto finished = std::make_shared<bool>(false);
  res.set_header("Cache-Control", "no-cache");
  const Tokenizer& tok = *c.engine.tokenizer();
  res.set_chunked_content_provider(
      "text/event-stream",
      [=, &tok](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          *last_write = std::chrono::steady_clock::now();
          return sink.write(s.data(), s.size());
        };
        bool all_done = true;
        std::string out;
        for (size_t i = 0; i < choices->size(); ++i) {
          Choice& ch = (*choices)[i];
          if (chat && !ch.role_sent) {
            out += chunk(i, "", nullptr, true);
            ch.role_sent = true;
          }
          if (!ch.finish.empty()) continue;
          const auto evs = ch.h->wait(std::chrono::milliseconds(choices->size() == 1 ? 100 : 10));
          for (const SeqEvent& e : evs) {
            const size_t offset = ch.text.size();
            apply(ch, e);
            // a chunk carries the log-probabilities of the tokens since the last chunk
            auto pending_lp = [&]() -> json {
              if (want_lp < 0 || ch.lp_ids.empty()) return nullptr;
              json lp = logprobs_json(tok, chat, ch.lp_ids, ch.lps, offset);
              ch.lp_ids.clear();
              ch.lps.clear();
              return lp;
            };
            if (!e.delta.empty()) out += chunk(i, e.delta, nullptr, false, pending_lp());
            if (e.finished) {
              if (client_finish(e.finish_reason)) {
                out += chunk(i, "", e.finish_reason, false, pending_lp());
              } else {
                const std::string msg = e.finish_reason == "abort" ? "the server shut down before the request finished"
                                                                   : e.finish_reason;
                out += "data: " + json_text(bad_request(msg).to_json()) + "\n\n";
              }
            }
          }
          all_done = all_done && !ch.finish.empty();
        }
        if (!out.empty() && !write(out)) {
          for (Choice& ch : *choices) ch.h->cancel();
          return false;
        }
        if (all_done) {
          std::string tail;
          if (usage) {
            int64_t completion = 0, cached = 0;
            for (const Choice& ch : *choices) {
              completion += ch.tokens;
              cached = std::max(cached, ch.cached);
            }
            json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                      {"model", model}, {"choices", json::array()}, {"usage", usage_json(P, completion, cached)}};
            tail += "data: " + json_text(u) + "\n\n";
          }
          tail += "data: [DONE]\n\n";
          *finished = true;
          if (!write(tail)) return false;
          sink.done();
          return true;
        }
        // a comment now and then finds a client that went away while nothing was written
        if (std::chrono::steady_clock::now() - *last_write > std::chrono::seconds(1) && !write(": keep-alive\n\n")) {
          for (Choice& ch : *choices) ch.h->cancel();
          return false;
        }
        return true;
      },
      [choices, finished](bool success) {
        if (!success || !*finished)
          for (Choice& ch : *choices) ch.h->cancel();
      });
}

}  // namespace nf4flash::serve
