// The BPE model of tokenizer.json: vocab, ranked merges (pair -> rank, result id), byte-level mode
// (pieces are raw bytes; vocab keys are mapped back from the GPT-2 byte-to-unicode alphabet),
// SentencePiece-style byte_fallback / unk / fuse_unk, continuing_subword_prefix,
// end_of_word_suffix and ignore_merges. Merging is lowest-rank-first, leftmost on ties (a linear
// scan for short words, a binary heap for long ones); results of repeated words are cached per
// thread.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/hashmap.h"

namespace nf4flash::tok {

// GPT-2 byte-to-unicode alphabet: the code point that stands for byte b, and the inverse (-1 if none).
uint32_t byte_to_unicode(uint8_t b);
int unicode_to_byte(uint32_t cp);

struct BpeTables;  // tokenizer_json.h

class BpeModel {
 public:
  // `model` is tokenizer.json's "model" object (type BPE). byte_level: the pre-tokenizer ends
  // with ByteLevel, so pieces arrive as raw bytes. tables: its vocab and merges, read by
  // parse_tokenizer_json (the document's "vocab" and "merges" are left empty).
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& model, bool byte_level,
                                             const std::string& where, const BpeTables& tables);

  // Appends the ids of one pre-tokenized piece.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view tok) const { return vocab_.get(tok); }
  // Empty when the id is not in the vocab.
  const std::string& id_to_token(int32_t id) const;
  bool metaspace_cut() const { return metaspace_cut_; }
  int32_t id_limit() const { return int32_t(id_to_tok_.size()); }  // max id + 1

 private:
  void encode_word(std::string_view w, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view w, std::vector<int32_t>& syms) const;
  void merge(std::vector<int32_t>& syms) const;

  StrMap vocab_;      // token text -> id
  StrMap raw_vocab_;  // byte-level: raw bytes -> id
  std::vector<std::string> id_to_tok_;
  PairMap merges_;
  bool byte_level_ = false;
  int32_t byte_ids_[256];      // byte-level: id of each byte's symbol
  int32_t fallback_ids_[256];  // byte_fallback: id of "<0xXX>" (or -1)
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  bool all_fallback_bytes_ = false;
  int32_t unk_id_ = -1;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  // Cut long pieces before each U+2581 that follows another character: valid when no vocab token
  // has a character followed by U+2581 (SentencePiece vocabularies), see the .cpp.
  bool metaspace_cut_ = false;
  uint64_t serial_ = 0;  // identifies this model to the per-thread cache
};

}  // namespace nf4flash::tok
