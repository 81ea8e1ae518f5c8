// StopText (stop_text.h).
#include "runtime/stop_text.h"

#include <algorithm>

namespace nf4flash {

StopText::StopText(const Tokenizer& tok, std::vector<std::string> stop) : stream_(tok, true), stop_(std::move(stop)) {
  for (const std::string& s : stop_) longest_ = std::max(longest_, s.size());
}

bool StopText::push(int32_t t) {
  if (stopped_) return true;
  // a stop string not found before this token can only appear ending in the new text
  const size_t from = text_.size() + 1 > longest_ ? text_.size() + 1 - longest_ : 0;
  text_ += stream_.push(t);
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, text_.find(s, from));
  if (cut == std::string::npos) return false;
  text_.resize(cut);
  stopped_ = true;
  return true;
}

void StopText::flush() {
  if (!stopped_) text_ += stream_.flush();
}

size_t StopText::ready() const {
  if (stopped_) return text_.size();
  size_t hold = 0;
  for (const std::string& s : stop_)
    for (size_t n = std::min(s.size() - 1, text_.size()); n > hold; --n)
      if (text_.compare(text_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  return text_.size() - hold;
}

}  // namespace nf4flash
