// UTF-8 helpers, code point classes (letter / number / White_Space / mark) with a two-stage
// lookup table, NFC/NFD normalization, and Rust-compatible lossy UTF-8 conversion.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace nf4flash::tok {

enum : uint8_t { kClsLetter = 1, kClsNumber = 2, kClsSpace = 4, kClsMark = 8 };

// Class bits of a code point (see above); two table loads.
uint8_t cp_class(uint32_t cp);

// Decodes one code point of valid UTF-8 at s[i]; advances i. (Input is validated beforehand.)
inline uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  uint32_t c = p[i];
  if (c < 0x80) {
    i += 1;
    return c;
  }
  if (c < 0xE0) {
    uint32_t r = ((c & 0x1F) << 6) | (p[i + 1] & 0x3F);
    i += 2;
    return r;
  }
  if (c < 0xF0) {
    uint32_t r = ((c & 0x0F) << 12) | ((p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    i += 3;
    return r;
  }
  uint32_t r = ((c & 0x07) << 18) | ((p[i + 1] & 0x3F) << 12) | ((p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
  i += 4;
  return r;
}

// Length in bytes of the UTF-8 sequence starting with lead byte b (1 for invalid leads).
inline int utf8_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

void utf8_append(std::string& out, uint32_t cp);

// Length of the longest prefix of s that is well-formed UTF-8.
size_t utf8_valid_prefix(std::string_view s);
inline bool utf8_valid(std::string_view s) { return utf8_valid_prefix(s) == s.size(); }

// Like Rust's String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD.
std::string utf8_lossy(std::string_view s);

// Unicode normalization forms C and D (canonical only). Input must be valid UTF-8.
std::string nfc(std::string_view s);
std::string nfd(std::string_view s);
// True when s is certainly already in NFC (quick check: no code point that may change).
bool nfc_quick_yes(std::string_view s);

}  // namespace nf4flash::tok
