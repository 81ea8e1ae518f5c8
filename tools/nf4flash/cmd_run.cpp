// nf4flash run: prompt in, tokens streamed out (text when the model folder has a tokenizer).
#include <cstdio>
#include <memory>

#include "commands.h"
#include "core/error.h"
#include "model_flags.h"
#include "text_io.h"

namespace nf4flash::cli {
namespace {

struct RunArgs {
  ModelFlags model;
  SamplingFlags sampling;
  std::string prompt, prompt_file, prompt_tokens, system;
  bool chat = false, print_ids = false, json = false;
};

int run_run(const RunArgs& a) {
  auto engine = load_engine(a.model);
  std::vector<int32_t> ids;
  if (!a.prompt_tokens.empty()) {
    if (a.chat) fail("--chat needs --prompt text, not --prompt-tokens");
    ids = parse_id_list(a.prompt_tokens, "--prompt-tokens");
  } else {
    const std::string text = a.prompt_file.empty() ? a.prompt : read_text_file(a.prompt_file);
    ids = a.chat ? encode_chat_prompt(*engine, text, a.system) : encode_text(*engine, text, true);
  }
  if (ids.empty()) fail("the prompt is empty");
  const bool as_text = engine->tokenizer() != nullptr && !a.print_ids;
  TextStreamer out(*engine, as_text);
  const GenerateResult r = engine->generate(ids, a.sampling.to_options(), [&](int32_t id) {
    out.push(id);
    return true;
  });
  out.finish();
  if (!a.model.quiet) std::fprintf(stderr, "%s | stop=%s\n", summary_line(*engine, r.timing).c_str(), r.stop_reason.c_str());
  return 0;
}

NF4FLASH_COMMAND("run", "Generate from a prompt, streaming the output", [](CLI::App& app) -> CommandRun {
  auto a = std::make_shared<RunArgs>();
  a->model.add(app);
  a->sampling.add(app);
  auto* g = app.add_option_group("prompt", "the prompt (one of)");
  g->add_option("--prompt,-p", a->prompt, "prompt text");
  g->add_option("--prompt-file,-f", a->prompt_file, "file holding the prompt text");
  g->add_option("--prompt-tokens", a->prompt_tokens, "comma-separated prompt token ids");
  g->require_option(1);
  app.add_flag("--chat", a->chat, "wrap the prompt as a user message with the model's chat template");
  app.add_option("--system", a->system, "with --chat: a system message");
  app.add_flag("--ids", a->print_ids, "print token ids instead of text");
  return [a] { return run_run(*a); };
});

}  // namespace
}  // namespace nf4flash::cli
