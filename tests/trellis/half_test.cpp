// fp16/bf16 conversions on bits must match the hardware (F16C) and the IEEE rules exactly.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "cpu/cpu_features.hpp"
#include "exl3/trellis/half.hpp"
#include "test_support.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_float_to_half(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) static float hw_half_to_float(uint16_t h) { return _cvtsh_ss(h); }
static bool have_f16c() { return exl3::cpu::cpu_has_f16c(); }
#endif

namespace tr = exl3::trellis;

TEST(Half, KnownValues) {
  EXPECT_EQ(tr::float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(tr::float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(tr::float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(tr::float_to_half(65520.0f), 0x7C00);  // ties to even -> inf
  EXPECT_EQ(tr::float_to_half(65519.99f), 0x7BFF);
  EXPECT_EQ(tr::float_to_half(5.9604644775390625e-8f), 0x0001);  // smallest subnormal
  EXPECT_EQ(tr::float_to_half(2.98023223876953125e-8f), 0x0000);  // exactly half of it: even
  EXPECT_EQ(tr::float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(tr::float_to_half(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(tr::float_to_half(std::nanf("")) & 0x7E00, 0x7E00);
  EXPECT_EQ(tr::half_to_float(0x3A25), 0.76806640625f);
  EXPECT_EQ(tr::half_to_float(0x0001), 5.9604644775390625e-8f);
  EXPECT_TRUE(std::isinf(tr::half_to_float(0xFC00)));
  EXPECT_EQ(tr::bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(tr::float_to_bf16(1.00390625f), 0x3F80);  // tie -> even
  EXPECT_EQ(tr::float_to_bf16(1.01171875f), 0x3F82);  // tie -> even (up)
}

TEST(Half, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = tr::half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(tr::float_to_half(f), h) << std::hex << h;
#if defined(__x86_64__)
    if (have_f16c()) {
      ASSERT_EQ(f, hw_half_to_float(static_cast<uint16_t>(h)));
    }
#endif
  }
}

TEST(Half, MatchesHardwareOnRandomFloats) {
#if defined(__x86_64__)
  if (!have_f16c()) GTEST_SKIP() << "CPU has no F16C";
  auto rng = exl3::test::make_rng();
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns concentrated around the fp16 range, plus fully random ones.
    uint32_t u = static_cast<uint32_t>(rng());
    if (i & 1) u = (u & 0x807FFFFFu) | ((100u + (u >> 23) % 50u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(tr::float_to_half(f), hw_float_to_half(f)) << std::hex << u;
  }
#else
  GTEST_SKIP() << "not x86";
#endif
}
