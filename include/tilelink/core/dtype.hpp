// Element types for tensor storage. Accumulation is always fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "tilelink/core/config.hpp"

namespace tilelink {

enum class DType : uint8_t { kF32, kBF16, kF16 };

TL_HD constexpr int dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "fp32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "fp16";
  }
  return "?";
}

// Parses "fp32" | "f32" | "float32", "bf16" | "bfloat16", "fp16" | "f16" | "float16".
bool parse_dtype(std::string_view s, DType* out);

// Host bf16 with the same round-to-nearest-even as CUDA's __float2bfloat16_rn, so CPU and GPU
// conversions give the same bits.
struct BF16 {
  uint16_t bits;
};

inline BF16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return BF16{static_cast<uint16_t>(u >> 16)};
}

inline float bf16_to_float(BF16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Host fp16 (IEEE binary16), round to nearest even.
struct F16 {
  uint16_t bits;
};
F16 float_to_f16(float f);
float f16_to_float(F16 h);

// Loads element i of a buffer of type t as float; stores a float into it (rounded to nearest even).
inline float load_as_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBF16: return bf16_to_float(static_cast<const BF16*>(p)[i]);
    case DType::kF16: return f16_to_float(static_cast<const F16*>(p)[i]);
  }
  return 0.f;
}
inline void store_from_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kBF16: static_cast<BF16*>(p)[i] = float_to_bf16(v); break;
    case DType::kF16: static_cast<F16*>(p)[i] = float_to_f16(v); break;
  }
}

}  // namespace tilelink
