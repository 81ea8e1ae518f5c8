// bitsandbytes code books and nearest-code decisions (see codebook.h for what each reproduces).
// All arithmetic here is float32 and must not be contracted into FMAs: the tables and decisions
// are compared bit for bit with what bitsandbytes/torch computed.
#pragma GCC optimize("fp-contract=off")
#include "quant/codebook.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace nf4flash {

const std::array<float, 16>& nf4_code() {
  // bitsandbytes.functional.get_4bit_type("nf4"): these decimal spellings are exact float32 values.
  static const std::array<float, 16> kCode = {
      -1.0f,
      -0.6961928009986877f,
      -0.5250730514526367f,
      -0.39491748809814453f,
      -0.28444138169288635f,
      -0.18477343022823334f,
      -0.09105003625154495f,
      0.0f,
      0.07958029955625534f,
      0.16093020141124725f,
      0.24611230194568634f,
      0.33791524171829224f,
      0.44070982933044434f,
      0.5626170039176941f,
      0.7229568362236023f,
      1.0f};
  return kCode;
}

const std::array<float, 16>& fp4_code() {
  // get_4bit_type("fp4"): [0, 0.0625, 8, 12, 4, 6, 2, 3, -0, -0.0625, -8, -12, -4, -6, -2, -3]
  // divided (float32) by its absolute maximum 12. Python's `-0` is the integer zero: +0.0.
  static const std::array<float, 16> kCode = [] {
    const float raw[16] = {0.0f,  0.0625f,  8.0f,  12.0f,  4.0f,  6.0f,  2.0f,  3.0f,
                           0.0f, -0.0625f, -8.0f, -12.0f, -4.0f, -6.0f, -2.0f, -3.0f};
    std::array<float, 16> c{};
    for (int i = 0; i < 16; ++i) c[i] = raw[i] / 12.0f;
    return c;
  }();
  return kCode;
}

const std::array<float, 16>& code4(QuantType t) {
  if (t == QuantType::NF4) return nf4_code();
  if (t == QuantType::FP4) return fp4_code();
  fail("4-bit code book requested for quant type ", quant_type_name(t));
}

const std::array<float, 16>& dequant_table4(QuantType t) {
  // dDequantizeFP4Tree returns magnitude * (1 - 2*sign_bit): code 0b1000 gives -0.0.
  static const std::array<float, 16> kFp4 = [] {
    std::array<float, 16> c = fp4_code();
    c[8] = -0.0f;
    return c;
  }();
  if (t == QuantType::FP4) return kFp4;
  return code4(t);
}

uint8_t quantize_nf4(float x) {
  // dQuantizeNF4: thresholds are the midpoints between neighbouring NF4 values, as float literals.
  if (x > 0.03979014977812767f) {
    if (x > 0.3893125355243683f) {
      if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 0b1111 : 0b1110;
      return x > 0.5016634166240692f ? 0b1101 : 0b1100;
    }
    if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 0b1011 : 0b1010;
    return x > 0.1202552504837513f ? 0b1001 : 0b1000;
  }
  if (x > -0.33967943489551544f) {
    if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 0b0111 : 0b0110;
    return x > -0.23460740596055984f ? 0b0101 : 0b0100;
  }
  if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 0b0011 : 0b0010;
  return x > -0.8480964004993439f ? 0b0001 : 0b0000;
}

uint8_t quantize_fp4(float x) {
  // dQuantizeFP4: sign bit 0b1000 for x < 0, then a tree on |x| (pivots are FP4 midpoints / 12).
  const uint8_t sign = x < 0.0f ? 0b1000 : 0b0000;
  x = std::fabs(x);
  uint8_t m;
  if (x > 0.29166667f) {
    if (x > 0.583333f)
      m = x > 0.8333333f ? 0b0011 : 0b0010;
    else
      m = x > 0.4166667f ? 0b0101 : 0b0100;
  } else if (x > 0.0859375f) {
    m = x > 0.20833333f ? 0b0111 : 0b0110;
  } else {
    m = x > 0.00260417f ? 0b0001 : 0b0000;
  }
  return static_cast<uint8_t>(m + sign);
}

namespace {

// torch.linspace(start, end, steps) for float32 on the CPU: the first half counts up from start,
// the second half down from end, with step = (end - start) / (steps - 1) in float. torch's kernel
// is compiled for AVX2+FMA, so `start + step * i` and `end - step * k` are fused multiply-adds:
// with plain float products 42 of the 256 map entries come out one ulp off bitsandbytes' map.
std::vector<float> torch_linspace_f32(float start, float end, int64_t steps) {
  std::vector<float> v(static_cast<size_t>(steps));
  if (steps == 1) {
    v[0] = start;
    return v;
  }
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  for (int64_t i = 0; i < steps; ++i) {
    if (i < halfway)
      v[i] = std::fma(step, static_cast<float>(i), start);
    else
      v[i] = std::fma(-step, static_cast<float>(steps - i - 1), end);
  }
  return v;
}

}  // namespace

const std::array<float, 256>& dynamic_map_signed() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for i in 0..6,
  // linspace(0.1, 1, 2^i + 1) midpoints (float32) times 10^(i-6) (a Python scalar, applied in
  // float32), positive and negative; plus 0 and 1; sorted.
  static const std::array<float, 256> kMap = [] {
    std::vector<float> data;
    for (int i = 0; i < 7; ++i) {
      const int64_t items = (int64_t{1} << i) + 1;
      const std::vector<float> b = torch_linspace_f32(0.1f, 1.0f, items);
      const float scale = static_cast<float>(std::pow(10.0, static_cast<double>(i - 6)));
      std::vector<float> means;
      for (int64_t k = 0; k + 1 < items; ++k) means.push_back((b[k] + b[k + 1]) / 2.0f);
      for (float m : means) data.push_back(scale * m);
      for (float m : means) data.push_back(-scale * m);
    }
    data.push_back(0.0f);
    data.push_back(1.0f);
    NF4FLASH_CHECK(data.size() == 256, "dynamic map has ", data.size(), " entries");
    std::sort(data.begin(), data.end());
    std::array<float, 256> a{};
    std::copy(data.begin(), data.end(), a.begin());
    return a;
  }();
  return kMap;
}

uint8_t quantize_dynamic8(const std::array<float, 256>& code, float x) {
  // dQuantize<STOCHASTIC=0>: binary search (7 halvings from pivot 127), then round to the nearer
  // neighbour by comparing with the float midpoint; a value exactly on a midpoint goes to the
  // pivot (upper side: x > midpoint needed; lower side: x < midpoint needed).
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  if (upper_pivot == 255) upper = code[upper_pivot];
  if (lower_pivot == 0) lower = code[lower_pivot];
  if (x > val) {
    const float midpoint = (upper + val) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = (lower + val) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lower_pivot : pivot);
}

float bnb_reciprocal(float a) {
  if (std::isnan(a)) return a;
  if (std::fabs(a) < FLT_MIN) return std::signbit(a) ? -INFINITY : INFINITY;  // ftz
  float r = 1.0f / a;
  uint32_t u;
  std::memcpy(&u, &a, 4);
  if ((u & 0xffffu) == 0) {
    switch (128 + ((u >> 16) & 127)) {
      case 132:
      case 150: r = std::nextafter(r, 0.0f); break;
      case 141:
      case 246: r = std::nextafter(r, std::signbit(a) ? -INFINITY : INFINITY); break;
      default: break;
    }
  }
  return r;
}

std::string_view quant_type_name(QuantType t) {
  switch (t) {
    case QuantType::None: return "none";
    case QuantType::NF4: return "nf4";
    case QuantType::FP4: return "fp4";
  }
  return "?";
}

bool quant_type_from_name(std::string_view s, QuantType* out) {
  if (s == "none") *out = QuantType::None;
  else if (s == "nf4") *out = QuantType::NF4;
  else if (s == "fp4") *out = QuantType::FP4;
  else return false;
  return true;
}

}  // namespace nf4flash
