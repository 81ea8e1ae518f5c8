// UTF-8 helpers, code point classes, NFC/NFD and lossy UTF-8 (see unicode.h). The class and
// NFC-check tables are expanded once from the generated ranges into two-stage lookup tables.
#include "tokenizer/unicode.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "tokenizer/unicode_tables.h"

namespace nf4flash::tok {
namespace {

constexpr uint32_t kMaxCp = 0x110000;

// Two-stage table: stage1[cp >> 8] selects a deduplicated 256-entry block of stage2.
struct TwoStage {
  std::vector<uint16_t> stage1;
  std::vector<uint8_t> stage2;
  uint8_t get(uint32_t cp) const {
    if (cp >= kMaxCp) return 0;
    return stage2[(size_t(stage1[cp >> 8]) << 8) | (cp & 0xFF)];
  }
};

TwoStage build_two_stage(const ucd::Range* ranges, size_t n) {
  std::vector<uint8_t> flat(kMaxCp, 0);
  for (size_t i = 0; i < n; ++i)
    for (uint32_t c = ranges[i].first; c <= ranges[i].last; ++c) flat[c] = uint8_t(ranges[i].value);
  TwoStage t;
  t.stage1.resize(kMaxCp >> 8);
  for (uint32_t b = 0; b < (kMaxCp >> 8); ++b) {
    const uint8_t* blk = flat.data() + (size_t(b) << 8);
    size_t nblocks = t.stage2.size() >> 8, found = nblocks;
    for (size_t k = 0; k < nblocks; ++k)
      if (std::memcmp(t.stage2.data() + (k << 8), blk, 256) == 0) {
        found = k;
        break;
      }
    if (found == nblocks) t.stage2.insert(t.stage2.end(), blk, blk + 256);
    t.stage1[b] = uint16_t(found);
  }
  return t;
}

const TwoStage& class_table() {
  static const TwoStage t = build_two_stage(ucd::kClassRanges, ucd::kClassRanges_count);
  return t;
}
const TwoStage& nfc_check_table() {
  static const TwoStage t = build_two_stage(ucd::kNfcCheckRanges, ucd::kNfcCheckRanges_count);
  return t;
}

uint8_t ccc(uint32_t cp) {
  if (cp < 0x300) return 0;
  const ucd::Range* r = ucd::kCccRanges;
  const ucd::Range* e = r + ucd::kCccRanges_count;
  auto it = std::upper_bound(r, e, cp, [](uint32_t c, const ucd::Range& x) { return c < x.first; });
  if (it == r) return 0;
  --it;
  return cp <= it->last ? uint8_t(it->value) : 0;
}

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

void decompose_into(std::vector<uint32_t>& out, uint32_t cp) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (cp >= 0xC0) {
    const ucd::Decomp* b = ucd::kDecomps;
    const ucd::Decomp* e = b + ucd::kDecomps_count;
    auto it = std::lower_bound(b, e, cp, [](const ucd::Decomp& d, uint32_t c) { return d.cp < c; });
    if (it != e && it->cp == cp) {
      out.insert(out.end(), ucd::kDecompData + it->offset, ucd::kDecompData + it->offset + it->length);
      return;
    }
  }
  out.push_back(cp);
}

// Returns the primary composite of (a, b) or 0.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const ucd::Compose* s = ucd::kComposes;
  const ucd::Compose* e = s + ucd::kComposes_count;
  auto it = std::lower_bound(s, e, std::make_pair(a, b), [](const ucd::Compose& c, std::pair<uint32_t, uint32_t> k) {
    return c.first < k.first || (c.first == k.first && c.second < k.second);
  });
  if (it != e && it->first == a && it->second == b) return it->composite;
  return 0;
}

std::vector<uint32_t> decompose_ordered(std::string_view s) {
  std::vector<uint32_t> buf;
  buf.reserve(s.size());
  for (size_t i = 0; i < s.size();) decompose_into(buf, utf8_next(s, i));
  // Canonical ordering: stable insertion sort of each run of non-starters by combining class.
  for (size_t i = 1; i < buf.size(); ++i) {
    uint8_t c = ccc(buf[i]);
    if (c == 0) continue;
    size_t j = i;
    while (j > 0) {
      uint8_t p = ccc(buf[j - 1]);
      if (p == 0 || p <= c) break;
      std::swap(buf[j - 1], buf[j]);
      --j;
    }
  }
  return buf;
}

}  // namespace

uint8_t cp_class(uint32_t cp) { return class_table().get(cp); }

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

namespace {
// Number of bytes of the well-formed sequence at p (1..4), or -k where k bytes form the maximal
// invalid subpart (k >= 1).
int utf8_step(const unsigned char* p, size_t avail) {
  unsigned char b = p[0];
  if (b < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (size_t(k) >= avail) return -k;
    unsigned char c = p[k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return -k;
  }
  return need + 1;
}
}  // namespace

size_t utf8_valid_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    int st = utf8_step(p + i, n - i);
    if (st < 0) return i;
    i += size_t(st);
  }
  return n;
}

std::string utf8_lossy(std::string_view s) {
  size_t ok = utf8_valid_prefix(s);
  if (ok == s.size()) return std::string(s);
  std::string out(s.substr(0, ok));
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = ok;
  while (i < s.size()) {
    int st = utf8_step(p + i, s.size() - i);
    if (st > 0) {
      out.append(s.data() + i, size_t(st));
      i += size_t(st);
    } else {
      out += "\xEF\xBF\xBD";
      i += size_t(-st);
    }
  }
  return out;
}

bool nfc_quick_yes(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const TwoStage& t = nfc_check_table();
  for (size_t i = 0; i < s.size();) {
    if (p[i] < 0xCC) {  // everything below U+0300 is NFC_QC=Yes with ccc 0
      i += utf8_len(p[i]);
      continue;
    }
    if (t.get(utf8_next(s, i))) return false;
  }
  return true;
}

std::string nfd(std::string_view s) {
  std::vector<uint32_t> buf = decompose_ordered(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (uint32_t c : buf) utf8_append(out, c);
  return out;
}

std::string nfc(std::string_view s) {
  if (nfc_quick_yes(s)) return std::string(s);
  std::vector<uint32_t> buf = decompose_ordered(s);
  if (!buf.empty()) {
    size_t starter_pos = 0, comp_pos = 1;
    uint32_t starter = buf[0];
    int last_class = ccc(starter) ? 256 : 0;
    for (size_t i = 1; i < buf.size(); ++i) {
      uint32_t ch = buf[i];
      int ch_class = ccc(ch);
      uint32_t composite = compose_pair(starter, ch);
      if (composite && (last_class < ch_class || last_class == 0)) {
        buf[starter_pos] = composite;
        starter = composite;
      } else {
        if (ch_class == 0) {
          starter_pos = comp_pos;
          starter = ch;
        }
        last_class = ch_class;
        buf[comp_pos++] = ch;
      }
    }
    buf.resize(comp_pos);
  }
  std::string out;
  out.reserve(s.size());
  for (uint32_t c : buf) utf8_append(out, c);
  return out;
}

}  // namespace nf4flash::tok
