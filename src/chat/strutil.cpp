// UTF-8 string helpers with Python str semantics (see strutil.h).
#include "chat/strutil.h"

#include <algorithm>

#include "core/error.h"

namespace nf4flash::chat {

std::vector<char32_t> utf8_decode(std::string_view s) {
  std::vector<char32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = s[i];
    char32_t cp;
    int n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c >> 5) == 6) { cp = c & 0x1f; n = 2; }
    else if ((c >> 4) == 14) { cp = c & 0x0f; n = 3; }
    else if ((c >> 3) == 30) { cp = c & 0x07; n = 4; }
    else { cp = 0xfffd; n = 1; }
    if (i + n > s.size()) { out.push_back(0xfffd); break; }
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

std::string utf8_encode(const std::vector<char32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (char32_t c : cps) utf8_append(out, c);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

bool py_isspace(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

char32_t ascii_upper(char32_t c) { return (c >= 'a' && c <= 'z') ? c - 32 : c; }
char32_t ascii_lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

std::string str_upper(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(ascii_upper(static_cast<unsigned char>(c)));
  return r;
}

std::string str_lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(ascii_lower(static_cast<unsigned char>(c)));
  return r;
}

std::string str_strip(std::string_view s, bool left, bool right, const std::string* chars) {
  std::vector<char32_t> cps = utf8_decode(s);
  std::vector<char32_t> set;
  if (chars) set = utf8_decode(*chars);
  auto strip_me = [&](char32_t c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_me(cps[b])) ++b;
  if (right)
    while (e > b && strip_me(cps[e - 1])) --e;
  return utf8_encode(std::vector<char32_t>(cps.begin() + b, cps.begin() + e));
}

std::vector<std::string> str_split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("chat template: split(): empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, pos);
      if (hit == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, hit - pos));
      pos = hit + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::vector<char32_t> cps = utf8_decode(s);
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && py_isspace(cps[i])) ++i;
    if (i >= n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t e = n;
      while (e > i && py_isspace(cps[e - 1])) --e;
      out.push_back(utf8_encode(std::vector<char32_t>(cps.begin() + i, cps.begin() + e)));
      break;
    }
    size_t j = i;
    while (j < n && !py_isspace(cps[j])) ++j;
    out.push_back(utf8_encode(std::vector<char32_t>(cps.begin() + i, cps.begin() + j)));
    i = j;
  }
  return out;
}

std::vector<std::string> str_rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0 || !sep) {
    if (maxsplit < 0) return str_split(s, sep, -1);
    // Whitespace rsplit with a limit: rare in templates; do it on the reversed code points.
    std::vector<char32_t> cps = utf8_decode(s);
    std::reverse(cps.begin(), cps.end());
    std::vector<std::string> parts = str_split(utf8_encode(cps), nullptr, maxsplit);
    for (auto& p : parts) {
      auto c = utf8_decode(p);
      std::reverse(c.begin(), c.end());
      p = utf8_encode(c);
    }
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  if (sep->empty()) fail("chat template: rsplit(): empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep->size()) break;
    size_t hit = s.rfind(*sep, end - sep->size());
    if (hit == std::string_view::npos) break;
    out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
    end = hit;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string str_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every code point (and at both ends).
    std::vector<char32_t> cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || done < count) { out += to; ++done; }
      if (k < cps.size()) utf8_append(out, cps[k]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

std::string str_title(std::string_view s) {
  // Jinja: split on runs of [-\s({\[<], upper-case each piece's first char, lower-case the rest.
  std::vector<char32_t> cps = utf8_decode(s);
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  bool start = true;
  for (char32_t& c : cps) {
    if (is_sep(c)) { start = true; continue; }
    c = start ? ascii_upper(c) : ascii_lower(c);
    start = false;
  }
  return utf8_encode(cps);
}

std::string str_capitalize(std::string_view s) {
  std::vector<char32_t> cps = utf8_decode(s);
  for (size_t k = 0; k < cps.size(); ++k) cps[k] = k == 0 ? ascii_upper(cps[k]) : ascii_lower(cps[k]);
  return utf8_encode(cps);
}

std::vector<int64_t> slice_indices(int64_t len, const int64_t* start_p, const int64_t* stop_p, int64_t step) {
  if (step == 0) fail("chat template: slice step cannot be zero");
  int64_t start, stop;
  if (step > 0) {
    start = start_p ? *start_p : 0;
    stop = stop_p ? *stop_p : len;
    if (start < 0) start = std::max<int64_t>(0, start + len);
    if (stop < 0) stop = std::max<int64_t>(0, stop + len);
    start = std::min(start, len);
    stop = std::min(stop, len);
  } else {
    start = start_p ? *start_p : len - 1;
    stop = stop_p ? *stop_p : -1 - len;  // sentinel: before the first element
    if (start < 0) start = std::max<int64_t>(-1, start + len);
    if (start >= len) start = len - 1;
    if (stop_p) {
      if (stop < 0) stop = std::max<int64_t>(-1, stop + len);
      if (stop >= len) stop = len - 1;
    } else {
      stop = -1;
    }
  }
  std::vector<int64_t> idx;
  if (step > 0)
    for (int64_t k = start; k < stop; k += step) idx.push_back(k);
  else
    for (int64_t k = start; k > stop; k += step) idx.push_back(k);
  return idx;
}

}  // namespace nf4flash::chat
