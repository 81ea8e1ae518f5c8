// Normalizers from tokenizer.json: NFC, NFD, Prepend, Replace (string pattern), Strip, Sequence.
// Applied to each piece of text between added tokens, as the Hugging Face library does.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace nf4flash::tok {

struct NormStep {
  enum class Kind { kNfc, kNfd, kPrepend, kReplace, kStrip } kind;
  std::string a, b;  // kPrepend: a = prefix; kReplace: a -> b
  bool left = false, right = false;  // kStrip
};

class Normalizer {
 public:
  static Normalizer from_json(const nlohmann::json& j, const std::string& where);
  bool empty() const { return steps_.empty(); }
  // Whether inputs may be cut before a space preceded by printable ASCII without changing the
  // output (apart from `continuation` suppressing a Prepend at the cut).
  bool chunkable() const { return chunkable_; }
  // True when some Replace step maps a space to `to`.
  bool replaces_space_with(const std::string& to) const {
    for (const NormStep& s : steps_)
      if (s.kind == NormStep::Kind::kReplace && s.a == " " && s.b == to) return true;
    return false;
  }
  // Normalizes `in` into `out`. continuation=true: `in` continues a longer piece that was cut for
  // parallel encoding, so Prepend does not apply.
  void run(std::string_view in, std::string& out, bool continuation = false) const;

 private:
  std::vector<NormStep> steps_;
  bool chunkable_ = true;
};

}  // namespace nf4flash::tok
