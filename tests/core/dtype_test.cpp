// Storage types: bf16 and fp16 round to nearest even, exactly as the GPU conversions do.
#include "tilelink/core/dtype.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "../support/random.hpp"

namespace tilelink {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// An independent bf16 rounding: the two neighbours by truncation, the nearer in double, ties to
// even.
uint16_t bf16_reference(float f) {
  uint32_t u = to_bits(f);
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  uint16_t hi = static_cast<uint16_t>(lo + 1);  // next magnitude up (may become inf)
  double x = std::fabs(static_cast<double>(f));
  double a = std::fabs(static_cast<double>(from_bits(static_cast<uint32_t>(lo) << 16)));
  double b = std::fabs(static_cast<double>(from_bits(static_cast<uint32_t>(hi) << 16)));
  if ((hi & 0x7fff) == 0x7f80)
    b = std::ldexp(1.0, 128);  // rounding up to inf: 2^128 is the boundary
  if (x - a < b - x) return lo;
  if (x - a > b - x) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(BF16, ExactTiesRoundToEven) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even -> 1.0 (0x3f80).
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808000u)).bits, 0x3f80);
  // 1 + 3*2^-8 halfway between 0x3f81 and 0x3f82: even is 0x3f82.
  EXPECT_EQ(float_to_bf16(from_bits(0x3f818000u)).bits, 0x3f82);
  // Just above / below a tie.
  EXPECT_EQ(float_to_bf16(from_bits(0x3f808001u)).bits, 0x3f81);
  EXPECT_EQ(float_to_bf16(from_bits(0x3f807fffu)).bits, 0x3f80);
  // Negative ties.
  EXPECT_EQ(float_to_bf16(from_bits(0xbf808000u)).bits, 0xbf80);
  EXPECT_EQ(float_to_bf16(from_bits(0xbf818000u)).bits, 0xbf82);
  // Carry into the exponent: 0x3fffc000 (just under 2, a tie at odd 0x3fff) -> 2.0.
  EXPECT_EQ(float_to_bf16(from_bits(0x3fffc000u)).bits, 0x4000);
  // Max float rounds to inf; the largest bf16 stays.
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(from_bits(0x7f7f0000u)).bits, 0x7f7f);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()).bits, 0xff80);
  EXPECT_EQ(float_to_bf16(0.f).bits, 0x0000);
  EXPECT_EQ(float_to_bf16(-0.f).bits, 0x8000);
  // Subnormal tie.
  EXPECT_EQ(float_to_bf16(from_bits(0x00008000u)).bits, 0x0000);
  EXPECT_EQ(float_to_bf16(from_bits(0x00018000u)).bits, 0x0002);
}

TEST(BF16, NaNStaysNaN) {
  for (uint32_t u :
       {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffc00000u, 0x7f80ffffu}) {
    BF16 h = float_to_bf16(from_bits(u));
    EXPECT_TRUE(std::isnan(bf16_to_float(h))) << std::hex << u << " -> " << h.bits;
    EXPECT_EQ(h.bits & 0x8000, (u >> 16) & 0x8000) << "sign kept";
  }
}

TEST(BF16, RandomFloatsMatchAnIndependentRounding) {
  TL_SEEDED_RNG(rng);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = static_cast<uint32_t>(rng.gen()());
    // Half the draws land on or next to a tie.
    if (i % 2) u = (u & 0xffff0000u) | (0x8000u + static_cast<uint32_t>(rng.uniform(-1, 1)));
    float f = from_bits(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f).bits, bf16_reference(f)) << std::hex << "bits 0x" << u;
  }
  // Every bf16 value converts back exactly.
  for (uint32_t b = 0; b < 65536; ++b) {
    BF16 h{static_cast<uint16_t>(b)};
    float f = bf16_to_float(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f).bits, b);
  }
}

TEST(F16, AllBitPatternsRoundTrip) {
  int nans = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = f16_to_float(F16{static_cast<uint16_t>(b)});
    bool is_nan = ((b >> 10) & 0x1f) == 0x1f && (b & 0x3ff);
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_TRUE(std::isnan(f16_to_float(float_to_f16(f))));
      ++nans;
      continue;
    }
    ASSERT_FALSE(std::isnan(f)) << std::hex << b;
    ASSERT_EQ(float_to_f16(f).bits, b) << std::hex << "0x" << b << " -> " << f;
#if defined(__FLT16_MAX__)
    // The compiler's own binary16 conversion agrees on the value.
    _Float16 h;
    uint16_t bits = static_cast<uint16_t>(b);
    std::memcpy(&h, &bits, 2);
    ASSERT_EQ(to_bits(static_cast<float>(h)), to_bits(f)) << std::hex << b;
#endif
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(F16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f).bits, 0x3c00);
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f).bits, 0x3c00);      // tie -> even
  EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f).bits, 0x3c02);  // tie -> even (up)
  EXPECT_EQ(float_to_f16(65504.f).bits, 0x7bff);              // max
  EXPECT_EQ(float_to_f16(65519.f).bits, 0x7bff);              // below the tie
  EXPECT_EQ(float_to_f16(65520.f).bits, 0x7c00);              // tie at odd max -> inf
  EXPECT_EQ(float_to_f16(0x1p-24f).bits, 0x0001);             // min subnormal
  EXPECT_EQ(float_to_f16(0x1p-25f).bits, 0x0000);             // tie -> even (0)
  EXPECT_EQ(float_to_f16(3 * 0x1p-25f).bits, 0x0002);         // tie -> even (2)
  EXPECT_EQ(float_to_f16(0x1p-14f - 0x1p-25f).bits, 0x0400);  // tie, carries to min normal
  EXPECT_EQ(float_to_f16(-2.0f).bits, 0xc000);
  EXPECT_EQ(float_to_f16(-0.f).bits, 0x8000);
  EXPECT_EQ(float_to_f16(1e10f).bits, 0x7c00);
  EXPECT_EQ(float_to_f16(-std::numeric_limits<float>::infinity()).bits, 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
}

#if defined(__FLT16_MAX__)
TEST(F16, RandomFloatsMatchTheCompilersConversion) {
  TL_SEEDED_RNG(rng);
  for (int i = 0; i < 200000; ++i) {
    float f;
    if (i % 2) {
      f = from_bits(static_cast<uint32_t>(rng.gen()()));
    } else {  // the f16 range, where rounding matters
      f = std::ldexp(rng.uniform_float(-1.f, 1.f), rng.uniform_int(-26, 17));
    }
    if (std::isnan(f)) continue;
    _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(float_to_f16(f).bits, want) << std::hexfloat << f;
  }
}
#endif

TEST(DType, NamesSizesAndLoadStore) {
  DType t;
  EXPECT_TRUE(parse_dtype("bf16", &t));
  EXPECT_EQ(t, DType::kBF16);
  EXPECT_TRUE(parse_dtype("float16", &t));
  EXPECT_EQ(t, DType::kF16);
  EXPECT_TRUE(parse_dtype("f32", &t));
  EXPECT_EQ(t, DType::kF32);
  EXPECT_FALSE(parse_dtype("int8", &t));
  EXPECT_EQ(dtype_size(DType::kF32), 4);
  EXPECT_EQ(dtype_size(DType::kBF16), 2);
  EXPECT_EQ(dtype_name(DType::kF16), "fp16");
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::byte buf[16];
    store_from_float(buf, d, 2, 1.5f);
    EXPECT_EQ(load_as_float(buf, d, 2), 1.5f) << dtype_name(d);
  }
}

}  // namespace
}  // namespace tilelink
