// Hugging Face tokenizer: reads tokenizer.json (+ tokenizer_config.json for bos/eos and Llama's
// add_bos_token/add_eos_token) and encodes/decodes exactly like the Rust `tokenizers` library:
// added tokens, normalizers, pre-tokenizers (hand-written Split matchers), BPE (byte-level and
// SentencePiece-style with byte fallback), post-processors and decoders. Encoding is thread-safe;
// long inputs are cut at safe places and encoded on several threads with identical results.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nf4flash {

namespace tok {
class TokenizerImpl;
}

class Tokenizer {
 public:
  // tokenizer_config_json may be empty (no config). Errors name the file at fault.
  static std::unique_ptr<Tokenizer> from_files(const std::string& tokenizer_json,
                                               const std::string& tokenizer_config_json);
  // DIR/tokenizer.json, plus DIR/tokenizer_config.json when present.
  static std::unique_ptr<Tokenizer> from_dir(const std::string& model_dir);
  ~Tokenizer();

  // add_special_tokens: apply the post-processor (e.g. prepend BOS). Special tokens written in the
  // text are always recognised, as in transformers. Inputs that are not valid UTF-8 are read with
  // each invalid sequence replaced by U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // threads <= 0: the global pool size (nf4flash::num_threads()).
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens,
                                                 int threads = 0) const;
  // Same as encode() but never uses more than one thread (benchmarks, and the inner loop of batches).
  std::vector<int32_t> encode_single_thread(std::string_view text, bool add_special_tokens) const;

  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The text a token adds inside a sequence: decode({anchor, id}) less decode({anchor}), where the
  // anchor is the one-token encoding of "a", so the leading space that SentencePiece decoders strip
  // from a sequence's first token is kept (llama2 "▁Hello" -> " Hello"; decode({id}) gives "Hello").
  // decode({id}) where "a" is not one token or its text is not a prefix. For logprob entries.
  std::string token_text(int32_t id) const;

  int32_t token_to_id(std::string_view tok) const;  // -1 if none
  std::string id_to_token(int32_t id) const;        // "" if none
  int vocab_size() const;                           // max id + 1, added tokens included
  bool is_special(int32_t id) const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  const std::string& bos_token() const;  // "" if none
  const std::string& eos_token() const;

  const tok::TokenizerImpl& impl() const { return *impl_; }

 private:
  Tokenizer() = default;
  std::unique_ptr<tok::TokenizerImpl> impl_;
  int32_t text_anchor_ = -1;  // token_text's anchor ("a"), -1: none
  std::string text_anchor_text_;
};

// Streaming decode: push ids one at a time and get the newly completed text. Text that would end
// in U+FFFD (an incomplete UTF-8 sequence) is held until a later token completes it; flush()
// returns whatever is left. The concatenation of all outputs equals decode() of all ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special_tokens = false);
  std::string push(int32_t id);
  std::string flush();
  void reset();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;  // the window: context ids [0, prefix_index_) + pending ids
  std::string prefix_;        // decode of the context ids
  size_t prefix_index_ = 0;
};

}  // namespace nf4flash
