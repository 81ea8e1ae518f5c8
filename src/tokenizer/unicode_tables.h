// Unicode Character Database tables used by the tokenizer (generated into unicode_tables.cpp by
// scripts/gen-unicode-tables.py): class ranges for the pre-tokenizer matchers and NFC data.
#pragma once
#include <cstddef>
#include <cstdint>

namespace nf4flash::tok::ucd {

struct Range {
  uint32_t first, last;
  uint32_t value;
};
struct Decomp {
  uint32_t cp, offset, length;  // full canonical decomposition: kDecompData[offset, offset+length)
};
struct Compose {
  uint32_t first, second, composite;  // sorted by (first, second); exclusions removed
};

extern const Range kClassRanges[];  // value: bit 1 letter (L*), 2 number (N*), 4 White_Space, 8 mark (M*)
extern const size_t kClassRanges_count;
extern const Range kCccRanges[];  // canonical combining class, nonzero only
extern const size_t kCccRanges_count;
extern const Range kNfcCheckRanges[];  // NFC_QC is No/Maybe, or ccc != 0
extern const size_t kNfcCheckRanges_count;
extern const uint32_t kDecompData[];
extern const Decomp kDecomps[];
extern const size_t kDecomps_count;
extern const Compose kComposes[];
extern const size_t kComposes_count;

}  // namespace nf4flash::tok::ucd
