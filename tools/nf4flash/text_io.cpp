#include "text_io.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "chat/chat_template.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace nf4flash::cli {

namespace {
const Tokenizer& need_tokenizer(const Engine& e) {
  if (!e.tokenizer())
    fail(e.report().model, ": no tokenizer.json in the model folder; give token ids with --prompt-tokens/--tokens");
  return *e.tokenizer();
}
}  // namespace

std::vector<int32_t> encode_text(const Engine& e, const std::string& text, bool add_special_tokens) {
  return need_tokenizer(e).encode(text, add_special_tokens);
}

std::vector<int32_t> encode_chat_prompt(const Engine& e, const std::string& text, const std::string& system) {
  const Tokenizer& tok = need_tokenizer(e);
  if (!e.chat_template())
    fail(e.report().model, ": --chat needs a chat template: ",
         e.chat_template_error().empty() ? "none found in tokenizer_config.json" : e.chat_template_error());
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  if (!system.empty()) msgs.push_back({{"role", "system"}, {"content", system}});
  msgs.push_back({{"role", "user"}, {"content", text}});
  const std::string rendered = e.chat_template()->apply(msgs, true);
  // The template already wrote BOS where the model wants it (as transformers' apply_chat_template
  // with tokenize=True: add_special_tokens=False).
  return tok.encode(rendered, false);
}

struct TextStreamer::State {
  bool as_text = false;
  bool first = true;
  std::unique_ptr<StreamDecoder> dec;
};

TextStreamer::TextStreamer(const Engine& e, bool as_text) : s_(std::make_unique<State>()) {
  s_->as_text = as_text && e.tokenizer();
  if (s_->as_text) s_->dec = std::make_unique<StreamDecoder>(*e.tokenizer(), true);
}
TextStreamer::~TextStreamer() = default;

void TextStreamer::push(int32_t id) {
  if (s_->as_text) {
    const std::string t = s_->dec->push(id);
    std::fwrite(t.data(), 1, t.size(), stdout);
  } else {
    std::printf(s_->first ? "%d" : ",%d", id);
  }
  s_->first = false;
  std::fflush(stdout);
}

void TextStreamer::finish() {
  if (s_->as_text) {
    const std::string t = s_->dec->flush();
    std::fwrite(t.data(), 1, t.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace nf4flash::cli
