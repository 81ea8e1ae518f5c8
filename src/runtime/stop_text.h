// A generated sequence's text, decoded token by token (StreamDecoder, special tokens skipped), with
// stop strings matched on the text across token boundaries: once one appears the text is cut before
// it. `batch` and `serve` use it; serve sends only ready() bytes, so a stream never takes back text
// that turns out to start a stop string.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace nf4flash {

class StopText {
 public:
  StopText(const Tokenizer& tok, std::vector<std::string> stop);
  // Appends token t's text; true once a stop string has appeared (then nothing more is appended).
  bool push(int32_t t);
  // Appends what the decoder still holds (incomplete UTF-8 at the end), unless stopped.
  void flush();
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }
  // Bytes of text() safe to show now: all once stopped, else all but a tail that could still be the
  // start of a stop string.
  size_t ready() const;

 private:
  StreamDecoder stream_;
  std::vector<std::string> stop_;
  size_t longest_ = 0;
  std::string text_;
  bool stopped_ = false;
};

}  // namespace nf4flash
