#include "core/dtype.h"

#include <cmath>

namespace nf4flash {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::U8: return 1;
    case DType::I8: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F64: return 8;
    case DType::Bool: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F64: return "F64";
    case DType::Bool: return "BOOL";
  }
  return "?";
}

bool dtype_from_name(std::string_view s, DType* out) {
  static constexpr struct { std::string_view n; DType t; } kNames[] = {
      {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"U8", DType::U8},
      {"I8", DType::I8},   {"I32", DType::I32}, {"I64", DType::I64},   {"F64", DType::F64},
      {"BOOL", DType::Bool}};
  for (const auto& e : kNames) {
    if (e.n == s) {
      *out = e.t;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (a < 0x38800000u) {  // subnormal or zero in f16: round to multiple of 2^-24
    float af;
    std::memcpy(&af, &a, 4);
    const float scaled = af * 16777216.0f;  // 2^24
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  // normal: rebias exponent, round mantissa to nearest even on 13 dropped bits
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
  r -= (112u << 23);
  return static_cast<uint16_t>(sign | (r >> 13));
}

}  // namespace nf4flash
