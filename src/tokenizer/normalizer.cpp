// Normalizers (see normalizer.h).
#include "tokenizer/normalizer.h"

#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace nf4flash::tok {

Normalizer Normalizer::from_json(const nlohmann::json& j, const std::string& where) {
  Normalizer n;
  if (j.is_null()) return n;
  std::function<void(const nlohmann::json&)> add = [&](const nlohmann::json& s) {
    std::string type = s.value("type", "");
    NormStep st{};
    if (type == "Sequence") {
      for (const auto& sub : s.at("normalizers")) add(sub);
      return;
    } else if (type == "NFC") {
      st.kind = NormStep::Kind::kNfc;
    } else if (type == "NFD") {
      st.kind = NormStep::Kind::kNfd;
    } else if (type == "Prepend") {
      st.kind = NormStep::Kind::kPrepend;
      st.a = s.at("prepend").get<std::string>();
    } else if (type == "Replace") {
      st.kind = NormStep::Kind::kReplace;
      const auto& pat = s.at("pattern");
      if (!pat.contains("String"))
        fail(where, ": normalizer Replace with a regex pattern is not supported");
      st.a = pat.at("String").get<std::string>();
      st.b = s.at("content").get<std::string>();
      if (st.a.empty()) fail(where, ": normalizer Replace with an empty pattern");
      size_t k = 0;
      utf8_next(st.a, k);
      if (k != st.a.size() || st.a.find(' ') != std::string::npos) {
        // Multi-character patterns could straddle a cut; a single space is fine.
        if (st.a != " ") n.chunkable_ = false;
      }
    } else if (type == "Strip") {
      st.kind = NormStep::Kind::kStrip;
      st.left = s.value("strip_left", true);
      st.right = s.value("strip_right", true);
      n.chunkable_ = false;
    } else {
      fail(where, ": normalizer type '", type, "' is not supported");
    }
    n.steps_.push_back(std::move(st));
  };
  add(j);
  return n;
}

void Normalizer::run(std::string_view in, std::string& out, bool continuation) const {
  out.assign(in);
  std::string tmp;
  for (const NormStep& st : steps_) {
    switch (st.kind) {
      case NormStep::Kind::kNfc:
        if (!nfc_quick_yes(out)) out = nfc(out);
        break;
      case NormStep::Kind::kNfd:
        out = nfd(out);
        break;
      case NormStep::Kind::kPrepend:
        if (!out.empty() && !continuation) out.insert(0, st.a);
        break;
      case NormStep::Kind::kReplace: {
        if (out.find(st.a) == std::string::npos) break;
        tmp.clear();
        tmp.reserve(out.size() + out.size() / 2);
        size_t i = 0;
        for (size_t p = out.find(st.a); p != std::string::npos; p = out.find(st.a, i)) {
          tmp.append(out, i, p - i);
          tmp += st.b;
          i = p + st.a.size();
        }
        tmp.append(out, i, std::string::npos);
        out.swap(tmp);
        break;
      }
      case NormStep::Kind::kStrip: {
        size_t b = 0, e = out.size();
        if (st.left)
          while (b < e) {
            size_t k = b;
            if (!(cp_class(utf8_next(out, k)) & kClsSpace)) break;
            b = k;
          }
        if (st.right)
          while (e > b) {
            size_t s = e - 1;
            while (s > b && (static_cast<unsigned char>(out[s]) & 0xC0) == 0x80) --s;
            size_t k = s;
            if (!(cp_class(utf8_next(out, k)) & kClsSpace)) break;
            e = s;
          }
        out = out.substr(b, e - b);
        break;
      }
    }
  }
}

}  // namespace nf4flash::tok
