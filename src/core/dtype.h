// Element types and scalar conversions (bf16/f16 <-> f32, round-to-nearest-even like PyTorch).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"

namespace nf4flash {

enum class DType : uint8_t { F32, F16, BF16, U8, I8, I32, I64, F64, Bool };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);          // safetensors spelling: "F32", "BF16", ...
bool dtype_from_name(std::string_view s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Round an f32 to the nearest bf16 value, kept as f32.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// Element i of f32/bf16/f16 data as f32, and f32 stored as element i; other dtypes are an error.
inline float host_load(const uint8_t* p, DType t, int64_t i) {
  switch (t) {
    case DType::F32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case DType::BF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h); }
    case DType::F16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return f16_to_f32(h); }
    default: fail("unsupported dtype ", dtype_name(t));
  }
}
inline void host_store(uint8_t* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::F32: std::memcpy(p + 4 * i, &v, 4); break;
    case DType::BF16: { uint16_t h = f32_to_bf16(v); std::memcpy(p + 2 * i, &h, 2); break; }
    case DType::F16: { uint16_t h = f32_to_f16(v); std::memcpy(p + 2 * i, &h, 2); break; }
    default: fail("unsupported dtype ", dtype_name(t));
  }
}

}  // namespace nf4flash
