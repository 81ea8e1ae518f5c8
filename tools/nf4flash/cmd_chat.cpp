// nf4flash chat: interactive multi-turn REPL with streaming output. Each turn renders the whole
// conversation with the model's chat template and generates until an EOS/EOT token.
// Commands: /reset (forget the conversation), /exit or Ctrl-D (quit).
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "commands.h"
#include "core/error.h"
#include "model_flags.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash::cli {
namespace {

struct ChatArgs {
  ModelFlags model;
  SamplingFlags sampling;
  std::string system;
};

int run_chat(ChatArgs a) {
  if (a.sampling.max_new_tokens == 128) a.sampling.max_new_tokens = 512;
  auto engine = load_engine(a.model);
  if (!engine->tokenizer()) fail(a.model.model, ": chat needs tokenizer.json in the model folder");
  if (!engine->chat_template())
    fail(a.model.model, ": chat needs a chat template (", engine->chat_template_error().empty() ? "none in tokenizer_config.json" : engine->chat_template_error(), ")");
  const Tokenizer& tok = *engine->tokenizer();
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  auto reset = [&] {
    msgs = nlohmann::ordered_json::array();
    if (!a.system.empty()) msgs.push_back({{"role", "system"}, {"content", a.system}});
  };
  reset();
  std::fprintf(stderr, "chat: /reset clears the conversation, /exit or Ctrl-D quits\n");
  std::string line;
  for (;;) {
    std::fprintf(stderr, "> ");
    std::fflush(stderr);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({{"role", "user"}, {"content", line}});
    const std::vector<int32_t> ids = tok.encode(engine->chat_template()->apply(msgs, true), false);
    StreamDecoder dec(tok, true);
    std::string reply;
    GenerateResult r;
    try {
      r = engine->generate(ids, a.sampling.to_options(), [&](int32_t id) {
        const std::string t = dec.push(id);
        reply += t;
        std::fwrite(t.data(), 1, t.size(), stdout);
        std::fflush(stdout);
        return true;
      });
    } catch (const Error& e) {
      msgs.erase(msgs.size() - 1);
      std::fprintf(stderr, "error: %s\n", e.what());
      continue;
    }
    const std::string rest = dec.flush();
    reply += rest;
    std::printf("%s\n", rest.c_str());
    // the reply as the template expects it: without the EOS text the model emitted
    const std::string eos = tok.eos_token();
    if (r.stop_reason == "eos" && !eos.empty() && reply.size() >= eos.size() &&
        reply.compare(reply.size() - eos.size(), eos.size(), eos) == 0)
      reply.resize(reply.size() - eos.size());
    msgs.push_back({{"role", "assistant"}, {"content", reply}});
    if (!a.model.quiet) std::fprintf(stderr, "%s\n", summary_line(*engine, r.timing).c_str());
  }
  return 0;
}

NF4FLASH_COMMAND("chat", "Interactive multi-turn chat with streaming (/reset, /exit, Ctrl-D)", [](CLI::App& app) -> CommandRun {
  auto a = std::make_shared<ChatArgs>();
  a->model.add(app);
  a->sampling.add(app);
  app.add_option("--system", a->system, "system message for the conversation");
  return [a] { return run_chat(*a); };
});

}  // namespace
}  // namespace nf4flash::cli
