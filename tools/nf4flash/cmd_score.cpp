// nf4flash score: log-likelihood of a token sequence (per-token log-probs and perplexity).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "model_flags.h"
#include "text_io.h"

namespace nf4flash::cli {
namespace {

struct ScoreArgs {
  ModelFlags model;
  std::string tokens, tokens_file, text, text_file;
  bool json = false, last_logits = false, add_special = false;
};

int run_score(const ScoreArgs& a) {
  auto engine = load_engine(a.model);
  std::vector<int32_t> ids;
  if (!a.tokens.empty()) ids = parse_id_list(a.tokens, "--tokens");
  else if (!a.tokens_file.empty()) ids = parse_id_list(read_text_file(a.tokens_file), "--tokens-file");
  else if (!a.text.empty() || !a.text_file.empty())
    ids = encode_text(*engine, a.text.empty() ? read_text_file(a.text_file) : a.text, a.add_special);
  if (ids.empty()) fail("score: no tokens given (use --tokens, --tokens-file, --text or --text-file)");
  const ScoreResult r = engine->score(ids, a.last_logits);
  if (a.json) {
    nlohmann::json j;
    j["n_tokens"] = ids.size();
    j["next_token_logprobs"] = r.next_token_logprobs;
    j["perplexity"] = r.perplexity;
    if (a.last_logits) j["last_logits"] = r.last_logits;
    j["timing"] = {{"prefill_ms", r.timing.prefill_ms}, {"prefill_tok_s", r.timing.prefill_tok_s()}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t t = 0; t < r.next_token_logprobs.size(); ++t)
      std::printf("%zu\t%d\t%.6f\n", t + 1, ids[t + 1], r.next_token_logprobs[t]);
    std::printf("perplexity\t%.6f\n", r.perplexity);
  }
  if (!a.model.quiet) std::fprintf(stderr, "%s\n", summary_line(*engine, r.timing).c_str());
  return 0;
}

NF4FLASH_COMMAND("score", "Log-likelihood of a token sequence: per-token log-probs and perplexity",
                 [](CLI::App& app) -> CommandRun {
                   auto a = std::make_shared<ScoreArgs>();
                   a->model.add(app);
                   auto* g = app.add_option_group("input", "what to score (one of)");
                   g->add_option("--tokens", a->tokens, "comma-separated token ids");
                   g->add_option("--tokens-file", a->tokens_file, "file with comma-separated token ids");
                   g->add_option("--text", a->text, "text, tokenized with the model's tokenizer");
                   g->add_option("--text-file", a->text_file, "file with text to tokenize");
                   g->require_option(1);
                   app.add_flag("--add-special-tokens", a->add_special, "with --text: add BOS/EOS as the tokenizer says");
                   app.add_flag("--json", a->json, "print one JSON object");
                   app.add_flag("--last-logits", a->last_logits, "with --json: include the last position's logits");
                   return [a] { return run_score(*a); };
                 });

}  // namespace
}  // namespace nf4flash::cli
