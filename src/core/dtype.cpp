#include "tilelink/core/dtype.hpp"

#include <cmath>

namespace tilelink {

bool parse_dtype(std::string_view s, DType* out) {
  if (s == "fp32" || s == "f32" || s == "float32") { *out = DType::kF32; return true; }
  if (s == "bf16" || s == "bfloat16") { *out = DType::kBF16; return true; }
  if (s == "fp16" || s == "f16" || s == "float16") { *out = DType::kF16; return true; }
  return false;
}

F16 float_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return F16{static_cast<uint16_t>(sign | 0x7e00u)};       // NaN
  if (absx >= 0x477ff000u) return F16{static_cast<uint16_t>(sign | 0x7c00u)};      // overflow -> inf
  if (absx < 0x38800000u) {                                                         // subnormal / zero
    // value = absx as float; f16 subnormal unit is 2^-24.
    float a;
    std::memcpy(&a, &absx, 4);
    float scaled = a * 16777216.0f;  // 2^24, exact
    uint32_t q = static_cast<uint32_t>(std::nearbyint(scaled));  // ties to even (default rounding)
    return F16{static_cast<uint16_t>(sign | q)};
  }
  uint32_t exp = ((absx >> 23) - 127 + 15) << 10;
  uint32_t mant = (absx >> 13) & 0x3ffu;
  uint32_t rest = absx & 0x1fffu;
  uint32_t h = exp | mant;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // round to nearest even (may carry)
  return F16{static_cast<uint16_t>(sign | h)};
}

float f16_to_float(F16 v) {
  uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(mant), -24);
    if (sign) out = -out;
    return out;
  }
  uint32_t u = exp == 31 ? (sign | 0x7f800000u | (mant << 13))
                         : (sign | ((exp - 15 + 127) << 23) | (mant << 13));
  std::memcpy(&out, &u, 4);
  return out;
}

}  // namespace tilelink
