// Decoders (see decoder.h).
#include "tokenizer/decoder.h"

#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/unicode.h"

namespace nf4flash::tok {
namespace {

const char kReplacementChar[] = "\xEF\xBF\xBD";

std::string replace_all(const std::string& s, const std::string& a, const std::string& b) {
  if (a.empty() || s.find(a) == std::string::npos) return s;
  std::string out;
  size_t i = 0;
  for (size_t p = s.find(a); p != std::string::npos; p = s.find(a, i)) {
    out.append(s, i, p - i);
    out += b;
    i = p + a.size();
  }
  out.append(s, i, std::string::npos);
  return out;
}

void byte_level(std::vector<std::string>& toks) {
  std::string bytes;
  for (const std::string& t : toks) {
    size_t mark = bytes.size();
    bool ok = true;
    for (size_t i = 0; i < t.size();) {
      int b = unicode_to_byte(utf8_next(t, i));
      if (b < 0) {
        ok = false;
        break;
      }
      bytes.push_back(char(b));
    }
    if (!ok) {
      bytes.resize(mark);
      bytes += t;
    }
  }
  toks.assign(1, utf8_lossy(bytes));
}

int fallback_byte(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  int h = hex(t[3]), l = hex(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

void byte_fallback(std::vector<std::string>& toks) {
  std::vector<std::string> out;
  out.reserve(toks.size());
  std::string pending;
  auto flush = [&] {
    if (pending.empty()) return;
    if (utf8_valid(pending)) {
      out.push_back(pending);
    } else {
      for (size_t i = 0; i < pending.size(); ++i) out.push_back(kReplacementChar);
    }
    pending.clear();
  };
  for (std::string& t : toks) {
    int b = fallback_byte(t);
    if (b >= 0) {
      pending.push_back(char(b));
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  toks.swap(out);
}

}  // namespace

Decoder Decoder::from_json(const nlohmann::json& j, const std::string& where) {
  Decoder d;
  if (j.is_null()) return d;
  d.present_ = true;
  std::function<void(const nlohmann::json&)> add = [&](const nlohmann::json& s) {
    std::string type = s.value("type", "");
    DecodeStep st{};
    if (type == "Sequence") {
      for (const auto& sub : s.at("decoders")) add(sub);
      return;
    } else if (type == "ByteLevel") {
      st.kind = DecodeStep::Kind::kByteLevel;
    } else if (type == "ByteFallback") {
      st.kind = DecodeStep::Kind::kByteFallback;
    } else if (type == "Fuse") {
      st.kind = DecodeStep::Kind::kFuse;
    } else if (type == "Metaspace") {
      st.kind = DecodeStep::Kind::kMetaspace;
      st.a = s.value("replacement", std::string("\xE2\x96\x81"));
      std::string scheme = s.value("prepend_scheme", s.value("add_prefix_space", true) ? "always" : "never");
      st.prepend = scheme != "never";
    } else if (type == "Replace") {
      st.kind = DecodeStep::Kind::kReplace;
      const auto& pat = s.at("pattern");
      if (!pat.contains("String")) fail(where, ": decoder Replace with a regex pattern is not supported");
      st.a = pat.at("String").get<std::string>();
      st.b = s.at("content").get<std::string>();
    } else if (type == "Strip") {
      st.kind = DecodeStep::Kind::kStrip;
      st.a = s.at("content").get<std::string>();
      st.start = s.value("start", size_t(0));
      st.stop = s.value("stop", size_t(0));
    } else {
      fail(where, ": decoder type '", type, "' is not supported");
    }
    d.steps_.push_back(std::move(st));
  };
  add(j);
  return d;
}

std::string Decoder::decode(std::vector<std::string> toks) const {
  if (!present_) {
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) {
      if (i) out.push_back(' ');
      out += toks[i];
    }
    return out;
  }
  for (const DecodeStep& st : steps_) {
    switch (st.kind) {
      case DecodeStep::Kind::kByteLevel:
        byte_level(toks);
        break;
      case DecodeStep::Kind::kByteFallback:
        byte_fallback(toks);
        break;
      case DecodeStep::Kind::kFuse: {
        std::string all;
        for (const std::string& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case DecodeStep::Kind::kReplace:
        for (std::string& t : toks) t = replace_all(t, st.a, st.b);
        break;
      case DecodeStep::Kind::kMetaspace:
        for (size_t i = 0; i < toks.size(); ++i)
          toks[i] = replace_all(toks[i], st.a, (i == 0 && st.prepend) ? "" : " ");
        break;
      case DecodeStep::Kind::kStrip:
        for (std::string& t : toks) {
          // Works on code points: strip up to `start` leading and `stop` trailing `content` chars.
          std::vector<size_t> pos;  // byte offset of each code point, plus the end
          for (size_t i = 0; i < t.size();) {
            pos.push_back(i);
            utf8_next(t, i);
          }
          pos.push_back(t.size());
          size_t n = pos.size() - 1, b = 0, e = n;
          auto is_content = [&](size_t k) { return t.compare(pos[k], pos[k + 1] - pos[k], st.a) == 0; };
          for (size_t k = 0; k < st.start && k < n && is_content(k); ++k) b = k + 1;
          for (size_t k = 0; k < st.stop && k < n; ++k) {
            size_t idx = n - k - 1;
            if (!is_content(idx)) break;
            e = idx;
          }
          t = b < e ? t.substr(pos[b], pos[e] - pos[b]) : std::string();
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

}  // namespace nf4flash::tok
