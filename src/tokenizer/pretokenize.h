// Pre-tokenizers: hand-written matchers for the Split regexes that Hugging Face tokenizer.json
// files carry (GPT-2 byte-level, Llama 3 / GPT-4 style, Qwen 2/3), plus ByteLevel, Metaspace and
// Sequence. Pieces are handed to a callback as views (no per-piece allocation on the hot path).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace nf4flash::tok {

// The regexes we implement by hand. Any other pattern is refused with the pattern in the message.
enum class SplitRegex {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,   // the same with \p{N} (one digit per piece)
};

// End (byte offset) of the regex match starting at byte i of s, or i when none starts there.
size_t split_match(SplitRegex re, std::string_view s, size_t i);

// Identifies a known regex; returns false when it is not one we implement.
bool split_regex_from_pattern(const std::string& pattern, SplitRegex* out);

struct PreTokStep {
  enum class Kind { kSplitRegex, kSplitString, kByteLevel, kMetaspace, kWhitespaceSplit } kind;
  SplitRegex regex = SplitRegex::kGpt2;
  std::string literal;     // kSplitString: the delimiter
  bool invert = false;     // kSplit*: keep only the matches (invert=false) semantics, see .cpp
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = false;         // kByteLevel: split with the GPT-2 regex first
  std::string replacement;        // kMetaspace (UTF-8 of the replacement char)
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;  // kMetaspace
  bool split = true;                                                          // kMetaspace
};

class PreTokenizer {
 public:
  // Parses the "pre_tokenizer" object (may be null). `where` names the file for errors.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& where);

  // True when the last step is ByteLevel: pieces are raw bytes and the model maps them.
  bool byte_level() const { return byte_level_; }
  bool empty() const { return steps_.empty(); }
  // True when splitting the input before a space preceded by a printable ASCII non-space byte
  // cannot change the result (used to encode long inputs on several threads).
  bool chunkable() const { return chunkable_ && splits_at_space_; }

  // Calls fn(piece) for each piece of `text`. `first` is true when the text starts the input
  // (Metaspace prepend_scheme "first").
  void run(std::string_view text, bool first, const std::function<void(std::string_view)>& fn) const;

 private:
  void run_from(size_t step, std::string_view text, bool first,
                const std::function<void(std::string_view)>& fn) const;
  std::vector<PreTokStep> steps_;
  bool byte_level_ = false;
  bool chunkable_ = true;
  bool splits_at_space_ = false;  // some step always starts a piece at such a space
};

}  // namespace nf4flash::tok
