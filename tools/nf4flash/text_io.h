// Text <-> ids at the CLI edge: prompt encoding (raw or through the chat template) and streaming
// decoded text to stdout as tokens arrive.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nf4flash/engine.h"

namespace nf4flash::cli {

// Encodes with the model's tokenizer; Error when the folder has no tokenizer.json.
std::vector<int32_t> encode_text(const Engine& e, const std::string& text, bool add_special_tokens);
// Renders [{system?}, {user: text}] with the chat template (add_generation_prompt) and encodes it.
std::vector<int32_t> encode_chat_prompt(const Engine& e, const std::string& text, const std::string& system);

// Prints generated tokens as they come: decoded text (holding incomplete UTF-8) or ids.
class TextStreamer {
 public:
  TextStreamer(const Engine& e, bool as_text);
  ~TextStreamer();
  void push(int32_t id);
  void finish();  // flushes held bytes and ends the line

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace nf4flash::cli
