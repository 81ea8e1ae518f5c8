// Decoders from tokenizer.json: ByteLevel, ByteFallback, Metaspace, Replace, Strip, Fuse and
// Sequence, with the Rust library's semantics (each step maps a list of token strings to a new
// list; the result is their concatenation).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace nf4flash::tok {

struct DecodeStep {
  enum class Kind { kByteLevel, kByteFallback, kMetaspace, kReplace, kStrip, kFuse } kind;
  std::string a, b;          // kReplace: a -> b; kMetaspace: a = replacement; kStrip: a = content
  size_t start = 0, stop = 0;  // kStrip
  bool prepend = true;         // kMetaspace: prepend_scheme != never
};

class Decoder {
 public:
  static Decoder from_json(const nlohmann::json& j, const std::string& where);
  bool present() const { return present_; }
  std::string decode(std::vector<std::string> tokens) const;

 private:
  std::vector<DecodeStep> steps_;
  bool present_ = false;
};

}  // namespace nf4flash::tok
