// Internal state of nf4flash::Tokenizer: the pipeline parsed from tokenizer.json (added tokens,
// normalizer, pre-tokenizer, BPE model, post-processor, decoder) and the bits of
// tokenizer_config.json that matter (bos/eos tokens, Llama add_bos_token/add_eos_token).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenize.h"

namespace nf4flash::tok {

// Post-processing for a single sequence: what goes before and after the encoded text.
struct PostProcessor {
  std::vector<int32_t> prefix, suffix;
};

class TokenizerImpl {
 public:
  void load(const std::string& tokenizer_json, const std::string& config_json);

  // The whole encode pipeline on one thread (no post-processing).
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  // Encodes, cutting long inputs into chunks encoded on up to `threads` threads.
  void encode_parallel(std::string_view text, std::vector<int32_t>& out, int threads) const;
  void add_special(std::vector<int32_t>& ids) const;
  // Whether long inputs can be cut for parallel encoding (see encode.cpp).
  bool chunkable() const { return chunkable_; }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;
  int32_t token_to_id(std::string_view t) const;
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

  int vocab_size = 0;
  std::string bos_token, eos_token;
  std::optional<int32_t> bos_id, eos_id;

 private:
  // Encodes one piece of text between raw-matched added tokens. first: it starts the input.
  // continuation: it continues a piece cut for parallel encoding (no Prepend, not first).
  void encode_segment(std::string_view seg, bool first, bool continuation, std::vector<int32_t>& out) const;
  // Plain text (no added tokens) after normalization.
  void encode_normalized(std::string_view norm, bool first, std::vector<int32_t>& out) const;

  std::string path_;
  std::vector<AddedToken> added_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  AddedTokenMatcher raw_matcher_, norm_matcher_;
  Normalizer normalizer_;
  PreTokenizer pretok_;
  std::unique_ptr<BpeModel> model_;
  PostProcessor post_;
  Decoder decoder_;
  bool chunkable_ = false;
};

}  // namespace nf4flash::tok
