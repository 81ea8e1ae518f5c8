// A small XML well-formedness checker for the bench SVG tests (no dependencies): prolog, comments,
// elements with quoted attributes (no duplicates), matched end tags, one root, and only the five
// predefined or numeric character references. Returns the elements in document order.
#pragma once
#include <cctype>
#include <map>
#include <string>
#include <vector>

namespace nf4flash::test {

struct XmlElement {
  std::string name;
  std::map<std::string, std::string> attrs;
  int depth = 0;
  std::string text;  // direct character data, references left as written
};

struct XmlDoc {
  std::vector<XmlElement> elements;
  std::string error;  // "" when well-formed
  bool ok() const { return error.empty(); }
  int count(const std::string& name, const std::string& attr = "", const std::string& value = "") const {
    int n = 0;
    for (const XmlElement& e : elements) {
      if (e.name != name) continue;
      if (!attr.empty()) {
        auto it = e.attrs.find(attr);
        if (it == e.attrs.end() || (!value.empty() && it->second != value)) continue;
      }
      ++n;
    }
    return n;
  }
};

class XmlChecker {
 public:
  explicit XmlChecker(const std::string& s) : s_(s) {}

  XmlDoc parse() {
    XmlDoc d;
    try {
      if (s_.compare(0, 5, "<?xml") == 0) {
        const size_t e = s_.find("?>");
        if (e == std::string::npos) throw std::string("unterminated XML declaration");
        i_ = e + 2;
      }
      int roots = 0;
      std::vector<size_t> stack;  // indices into d.elements
      while (i_ < s_.size()) {
        if (s_.compare(i_, 4, "<!--") == 0) {
          const size_t e = s_.find("-->", i_ + 4);
          if (e == std::string::npos) throw std::string("unterminated comment");
          i_ = e + 3;
        } else if (s_.compare(i_, 2, "</") == 0) {
          i_ += 2;
          const std::string name = read_name();
          skip_ws();
          expect('>');
          if (stack.empty() || d.elements[stack.back()].name != name)
            throw "end tag </" + name + "> does not match " + (stack.empty() ? "nothing" : d.elements[stack.back()].name);
          stack.pop_back();
        } else if (s_[i_] == '<') {
          ++i_;
          XmlElement el;
          el.name = read_name();
          el.depth = static_cast<int>(stack.size());
          if (stack.empty() && ++roots > 1) throw std::string("more than one root element");
          for (;;) {
            const bool had_ws = skip_ws();
            if (i_ >= s_.size()) throw std::string("unterminated start tag <" + el.name);
            if (s_[i_] == '/' || s_[i_] == '>') break;
            if (!had_ws) throw "missing space between attributes of <" + el.name + ">";
            const std::string an = read_name();
            skip_ws();
            expect('=');
            skip_ws();
            const char q = s_[i_];
            if (q != '"' && q != '\'') throw "unquoted attribute " + an;
            const size_t e = s_.find(q, i_ + 1);
            if (e == std::string::npos) throw "unterminated attribute " + an;
            const std::string v = s_.substr(i_ + 1, e - i_ - 1);
            if (v.find('<') != std::string::npos) throw "'<' in attribute " + an;
            check_refs(v);
            if (!el.attrs.emplace(an, v).second) throw "duplicate attribute " + an + " on <" + el.name + ">";
            i_ = e + 1;
          }
          const bool empty = s_[i_] == '/';
          if (empty) ++i_;
          expect('>');
          d.elements.push_back(el);
          if (!empty) stack.push_back(d.elements.size() - 1);
        } else {
          const size_t e = s_.find('<', i_);
          const std::string t = s_.substr(i_, e == std::string::npos ? std::string::npos : e - i_);
          check_refs(t);
          if (stack.empty()) {
            for (char c : t)
              if (!std::isspace(static_cast<unsigned char>(c))) throw std::string("text outside the root element");
          } else {
            d.elements[stack.back()].text += t;
          }
          i_ = e == std::string::npos ? s_.size() : e;
        }
      }
      if (!stack.empty()) throw "unclosed element <" + d.elements[stack.back()].name + ">";
      if (roots == 0) throw std::string("no root element");
    } catch (const std::string& e) {
      d.error = e + " (at byte " + std::to_string(i_) + ")";
    }
    return d;
  }

 private:
  bool skip_ws() {
    const size_t s = i_;
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
    return i_ > s;
  }
  void expect(char c) {
    if (i_ >= s_.size() || s_[i_] != c) throw std::string("expected '") + c + "'";
    ++i_;
  }
  std::string read_name() {
    const size_t s = i_;
    if (i_ >= s_.size() || !(std::isalpha(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_' || s_[i_] == ':'))
      throw std::string("bad name");
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_' || s_[i_] == ':' ||
                              s_[i_] == '-' || s_[i_] == '.'))
      ++i_;
    return s_.substr(s, i_ - s);
  }
  static void check_refs(const std::string& t) {
    for (size_t p = t.find('&'); p != std::string::npos; p = t.find('&', p + 1)) {
      const size_t e = t.find(';', p);
      if (e == std::string::npos) throw std::string("bare '&'");
      const std::string r = t.substr(p + 1, e - p - 1);
      if (r == "amp" || r == "lt" || r == "gt" || r == "quot" || r == "apos") continue;
      if (r.size() > 1 && r[0] == '#') continue;
      throw "unknown entity &" + r + ";";
    }
  }

  const std::string& s_;
  size_t i_ = 0;
};

inline XmlDoc parse_xml(const std::string& s) { return XmlChecker(s).parse(); }

}  // namespace nf4flash::test
