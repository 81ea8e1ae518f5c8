#include "text_io.h"

#include <cstdio>

#include "core/error.h"

namespace nf4flash::cli {

struct TextStreamer::State {
  bool as_text = false;
  bool first = true;
};

std::vector<int32_t> encode_text(const Engine& e, const std::string& text, bool add_special_tokens) {
  fail(e.report().model, ": no tokenizer.json; give token ids with --prompt-tokens/--tokens");
}

std::vector<int32_t> encode_chat_prompt(const Engine& e, const std::string& text, const std::string& system) {
  fail(e.report().model, ": no tokenizer.json; --chat needs a tokenizer and chat template");
}

TextStreamer::TextStreamer(const Engine& e, bool as_text) : s_(std::make_unique<State>()) { s_->as_text = as_text; }
TextStreamer::~TextStreamer() = default;

void TextStreamer::push(int32_t id) {
  std::printf(s_->first ? "%d" : ",%d", id);
  s_->first = false;
  std::fflush(stdout);
}

void TextStreamer::finish() { std::printf("\n"); }

}  // namespace nf4flash::cli
