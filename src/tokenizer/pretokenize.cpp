// Pre-tokenizers (see pretokenize.h). The Split matchers follow the regexes' leftmost-first
// alternation exactly (as Oniguruma runs them in the Rust tokenizers library), one alternative
// after another, on code point classes from the generated Unicode tables.
#include "tokenizer/pretokenize.h"

#include <array>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace nf4flash::tok {
namespace {

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Class of the code point at byte i (and its byte length) with an ASCII fast path.
struct Cp {
  uint32_t cp;
  uint8_t cls;
  uint8_t len;
};

uint8_t ascii_class(unsigned char c) {
  static const auto table = [] {
    std::array<uint8_t, 128> t{};
    for (int c = 0; c < 128; ++c) t[size_t(c)] = cp_class(uint32_t(c));
    return t;
  }();
  return table[c];
}

inline Cp cp_at(std::string_view s, size_t i) {
  unsigned char b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return {b, ascii_class(b), 1};
  size_t j = i;
  uint32_t cp = utf8_next(s, j);
  return {cp, cp_class(cp), uint8_t(j - i)};
}

constexpr uint8_t kLN = kClsLetter | kClsNumber;
inline bool is_other(uint8_t cls) { return (cls & (kLN | kClsSpace)) == 0; }

size_t scan_class(std::string_view s, size_t j, uint8_t mask) {
  while (j < s.size()) {
    Cp c = cp_at(s, j);
    if (!(c.cls & mask)) break;
    j += c.len;
  }
  return j;
}

size_t scan_other(std::string_view s, size_t j) {
  while (j < s.size()) {
    Cp c = cp_at(s, j);
    if (!is_other(c.cls)) break;
    j += c.len;
  }
  return j;
}

// Contractions at s[i] == '\''. Returns end or i.
size_t match_contraction(std::string_view s, size_t i, bool icase) {
  size_t n = s.size();
  if (i + 1 >= n) return i;
  auto lower = [&](unsigned char c) -> unsigned char {
    return icase && c >= 'A' && c <= 'Z' ? c + 32 : c;
  };
  unsigned char c1 = lower(static_cast<unsigned char>(s[i + 1]));
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
  // U+017F LATIN SMALL LETTER LONG S case-folds to 's' under (?i).
  if (icase && c1 == 0xC5 && i + 2 < n && static_cast<unsigned char>(s[i + 2]) == 0xBF) return i + 3;
  if (i + 2 >= n) return i;
  unsigned char c2 = lower(static_cast<unsigned char>(s[i + 2]));
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return i + 3;
  return i;
}

// Whitespace alternatives shared by the patterns, at a whitespace code point s[i].
// with_newline_alt: the \s*[\r\n]+ alternative (Llama 3 / Qwen) comes first.
size_t match_space(std::string_view s, size_t i, bool with_newline_alt) {
  size_t j = i, last_nl_end = 0, last_start = i;
  while (j < s.size()) {
    Cp c = cp_at(s, j);
    if (!(c.cls & kClsSpace)) break;
    if (c.cp == '\r' || c.cp == '\n') last_nl_end = j + 1;
    last_start = j;
    j += c.len;
  }
  if (with_newline_alt && last_nl_end) return last_nl_end;  // \s*[\r\n]+
  if (j == s.size()) return j;                              // \s+(?!\S) at the end
  if (last_start > i) return last_start;                    // \s+(?!\S): leave one for the next
  return j;                                                 // \s+
}

size_t match_llama3(std::string_view s, size_t i, int max_digits) {
  Cp c0 = cp_at(s, i);
  if (c0.cp == '\'') {
    size_t e = match_contraction(s, i, true);
    if (e != i) return e;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c0.cls & kClsLetter) return scan_class(s, i + c0.len, kClsLetter);
  if (c0.cp != '\r' && c0.cp != '\n' && !(c0.cls & kClsNumber) && i + c0.len < s.size()) {
    Cp c1 = cp_at(s, i + c0.len);
    if (c1.cls & kClsLetter) return scan_class(s, i + c0.len + c1.len, kClsLetter);
  }
  // \p{N}{1,max}
  if (c0.cls & kClsNumber) {
    size_t j = i + c0.len;
    for (int k = 1; k < max_digits && j < s.size(); ++k) {
      Cp c = cp_at(s, j);
      if (!(c.cls & kClsNumber)) break;
      j += c.len;
    }
    return j;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  {
    size_t j = c0.cp == ' ' ? i + 1 : i;
    if (j < s.size() && is_other(cp_at(s, j).cls)) {
      j = scan_other(s, j);
      while (j < s.size() && (s[j] == '\r' || s[j] == '\n')) ++j;
      return j;
    }
  }
  if (c0.cls & kClsSpace) return match_space(s, i, true);
  return i;
}

size_t match_gpt2(std::string_view s, size_t i) {
  Cp c0 = cp_at(s, i);
  if (c0.cp == '\'') {
    size_t e = match_contraction(s, i, false);
    if (e != i) return e;
  }
  size_t j = c0.cp == ' ' ? i + 1 : i;
  if (j < s.size()) {
    Cp c = j == i ? c0 : cp_at(s, j);
    if (c.cls & kClsLetter) return scan_class(s, j + c.len, kClsLetter);
    if (c.cls & kClsNumber) return scan_class(s, j + c.len, kClsNumber);
    if (is_other(c.cls)) return scan_other(s, j + c.len);
  }
  if (c0.cls & kClsSpace) return match_space(s, i, false);
  return i;
}

}  // namespace

size_t split_match(SplitRegex re, std::string_view s, size_t i) {
  switch (re) {
    case SplitRegex::kGpt2: return match_gpt2(s, i);
    case SplitRegex::kLlama3: return match_llama3(s, i, 3);
    case SplitRegex::kQwen2: return match_llama3(s, i, 1);
  }
  return i;
}

bool split_regex_from_pattern(const std::string& p, SplitRegex* out) {
  if (p == kGpt2Pattern) *out = SplitRegex::kGpt2;
  else if (p == kLlama3Pattern) *out = SplitRegex::kLlama3;
  else if (p == kQwen2Pattern) *out = SplitRegex::kQwen2;
  else return false;
  return true;
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j, const std::string& where) {
  PreTokenizer pt;
  if (j.is_null()) return pt;
  std::function<void(const nlohmann::json&)> add = [&](const nlohmann::json& s) {
    std::string type = s.value("type", "");
    PreTokStep st{};
    if (type == "Sequence") {
      for (const auto& sub : s.at("pretokenizers")) add(sub);
      return;
    } else if (type == "Split") {
      const auto& pat = s.at("pattern");
      std::string behavior = s.value("behavior", "Isolated");
      if (behavior != "Isolated")
        fail(where, ": pre_tokenizer Split with behavior '", behavior, "' is not supported (only Isolated)");
      if (s.value("invert", false)) fail(where, ": pre_tokenizer Split with invert=true is not supported");
      if (pat.contains("Regex")) {
        std::string re = pat.at("Regex").get<std::string>();
        st.kind = PreTokStep::Kind::kSplitRegex;
        pt.splits_at_space_ = true;
        if (!split_regex_from_pattern(re, &st.regex))
          fail(where, ": pre_tokenizer Split regex is not one nf4flash implements: ", re);
      } else {
        st.kind = PreTokStep::Kind::kSplitString;
        st.literal = pat.at("String").get<std::string>();
        if (st.literal.empty()) fail(where, ": pre_tokenizer Split with an empty string pattern");
        pt.chunkable_ = false;
      }
    } else if (type == "ByteLevel") {
      st.kind = PreTokStep::Kind::kByteLevel;
      st.add_prefix_space = s.value("add_prefix_space", false);
      st.use_regex = s.value("use_regex", true);
      if (st.add_prefix_space) pt.chunkable_ = false;
      if (st.use_regex) pt.splits_at_space_ = true;
    } else if (type == "Metaspace") {
      st.kind = PreTokStep::Kind::kMetaspace;
      st.replacement = s.value("replacement", std::string("\xE2\x96\x81"));
      std::string scheme = s.value("prepend_scheme", s.value("add_prefix_space", true) ? "always" : "never");
      if (scheme == "always") st.prepend = PreTokStep::Prepend::kAlways;
      else if (scheme == "first") st.prepend = PreTokStep::Prepend::kFirst;
      else if (scheme == "never") st.prepend = PreTokStep::Prepend::kNever;
      else fail(where, ": pre_tokenizer Metaspace prepend_scheme '", scheme, "' is unknown");
      st.split = s.value("split", true);
      if (!st.split && st.prepend == PreTokStep::Prepend::kAlways) pt.chunkable_ = false;
      if (st.split) pt.splits_at_space_ = true;
    } else if (type == "WhitespaceSplit") {
      st.kind = PreTokStep::Kind::kWhitespaceSplit;
      pt.splits_at_space_ = true;
    } else {
      fail(where, ": pre_tokenizer type '", type, "' is not supported");
    }
    pt.steps_.push_back(std::move(st));
  };
  add(j);
  for (size_t i = 0; i + 1 < pt.steps_.size(); ++i)
    if (pt.steps_[i].kind == PreTokStep::Kind::kByteLevel)
      fail(where, ": pre_tokenizer ByteLevel must be the last step");
  pt.byte_level_ = !pt.steps_.empty() && pt.steps_.back().kind == PreTokStep::Kind::kByteLevel;
  return pt;
}

void PreTokenizer::run(std::string_view text, bool first,
                       const std::function<void(std::string_view)>& fn) const {
  if (text.empty()) return;
  run_from(0, text, first, fn);
}

void PreTokenizer::run_from(size_t step, std::string_view text, bool first,
                            const std::function<void(std::string_view)>& fn) const {
  if (text.empty()) return;
  if (step == steps_.size()) {
    fn(text);
    return;
  }
  const PreTokStep& st = steps_[step];
  auto emit_regex = [&](SplitRegex re, std::string_view t, bool f) {
    size_t i = 0, gap = 0;
    while (i < t.size()) {
      size_t e = split_match(re, t, i);
      if (e == i) {  // no match here: the character goes into a gap piece
        i += size_t(utf8_len(static_cast<unsigned char>(t[i])));
        continue;
      }
      if (gap < i) run_from(step + 1, t.substr(gap, i - gap), f && gap == 0, fn);
      run_from(step + 1, t.substr(i, e - i), f && i == 0, fn);
      i = gap = e;
    }
    if (gap < t.size()) run_from(step + 1, t.substr(gap), f && gap == 0, fn);
  };
  switch (st.kind) {
    case PreTokStep::Kind::kSplitRegex:
      emit_regex(st.regex, text, first);
      return;
    case PreTokStep::Kind::kSplitString: {
      // Isolated: the delimiter is its own piece.
      size_t i = 0;
      while (i < text.size()) {
        size_t p = text.find(st.literal, i);
        if (p == std::string_view::npos) break;
        if (p > i) run_from(step + 1, text.substr(i, p - i), first && i == 0, fn);
        run_from(step + 1, text.substr(p, st.literal.size()), first && p == 0, fn);
        i = p + st.literal.size();
      }
      if (i < text.size()) run_from(step + 1, text.substr(i), first && i == 0, fn);
      return;
    }
    case PreTokStep::Kind::kWhitespaceSplit: {
      size_t i = 0;
      while (i < text.size()) {
        size_t j = i;
        while (j < text.size()) {
          size_t k = j;
          uint32_t cp = utf8_next(text, k);
          if (cp_class(cp) & kClsSpace) break;
          j = k;
        }
        if (j > i) run_from(step + 1, text.substr(i, j - i), first && i == 0, fn);
        if (j >= text.size()) break;
        size_t k = j;
        utf8_next(text, k);
        i = k;
      }
      return;
    }
    case PreTokStep::Kind::kByteLevel: {
      std::string buf;
      std::string_view t = text;
      if (st.add_prefix_space && text[0] != ' ') {
        buf.reserve(text.size() + 1);
        buf.push_back(' ');
        buf.append(text);
        t = buf;
      }
      if (st.use_regex) emit_regex(SplitRegex::kGpt2, t, first);
      else run_from(step + 1, t, first, fn);
      return;
    }
    case PreTokStep::Kind::kMetaspace: {
      std::string buf;
      const std::string& r = st.replacement;
      bool prepend = st.prepend == PreTokStep::Prepend::kAlways ||
                     (st.prepend == PreTokStep::Prepend::kFirst && first);
      if (prepend && text.substr(0, r.size()) != r) buf = r;
      for (char c : text) {
        if (c == ' ') buf += r;
        else buf.push_back(c);
      }
      std::string_view t = buf;
      if (!st.split) {
        run_from(step + 1, t, first, fn);
        return;
      }
      size_t start = 0;
      for (size_t p = t.find(r, 1); p != std::string_view::npos; p = t.find(r, p + r.size())) {
        if (p > start) run_from(step + 1, t.substr(start, p - start), first && start == 0, fn);
        start = p;
      }
      run_from(step + 1, t.substr(start), first && start == 0, fn);
      return;
    }
  }
}

}  // namespace nf4flash::tok
