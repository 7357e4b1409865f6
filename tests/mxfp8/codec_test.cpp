// The MXFP8 codec (exl3/mxfp8/codec.hpp) against an independent fp64 model of the OCP formats:
// E4M3 values from their sign/exponent/mantissa fields with std::ldexp, rounding by exhaustive
// nearest-code search, scales from std::frexp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/mxfp8/codec.hpp"
#include "test_support.hpp"

namespace mx = exl3::mxfp8;

namespace {

// OCP E4M3 by its definition: bias 7, subnormals m/8 * 2^-6, S.1111.111 NaN, no infinities.
double ref_e4m3(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// Nearest finite code to v (ties to the even mantissa), saturating at +-448.
int ref_encode(double v) {
  const bool neg = std::signbit(v);
  const double a = std::min(std::fabs(v), 448.0);
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 127; ++c) {  // non-negative finite codes 0x00..0x7E
    const double d = std::fabs(ref_e4m3(c) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return (neg ? 0x80 : 0) | best;
}

TEST(Mxfp8Codec, All256CodesDecodeExactly) {
  for (int c = 0; c < 256; ++c) {
    const double ref = ref_e4m3(c);
    const float got = mx::e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(got)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), ref) << "code " << c;
    EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;  // -0 for 0x80
    // The kernels' fp16 trick: exactly value * 2^-8.
    const float h = exl3::trellis::half_to_float(mx::e4m3_to_half_bits_scaled(static_cast<uint8_t>(c)));
    EXPECT_EQ(static_cast<double>(h), std::ldexp(ref, -8)) << "code " << c;
    // Every finite code is its own encoding.
    EXPECT_EQ(mx::float_to_e4m3(got), c) << "code " << c;
  }
  EXPECT_EQ(mx::e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(mx::e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(Mxfp8Codec, RoundingAtEveryMidpointAndRandomValues) {
  // Midpoints between neighbouring codes (ties to even) and values just either side.
  for (int c = 0; c < 126; ++c) {
    const double lo = ref_e4m3(c), hi = ref_e4m3(c + 1), mid = (lo + hi) / 2;
    const auto fm = static_cast<float>(mid);  // exact: E4M3 midpoints have 5 significant bits
    for (float f : {fm, std::nextafter(fm, 0.0f), std::nextafter(fm, 1e9f)}) {
      const double v = f;
      EXPECT_EQ(mx::float_to_e4m3(f), ref_encode(f)) << v;
      EXPECT_EQ(mx::float_to_e4m3(-f), ref_encode(-static_cast<double>(f))) << -v;
    }
  }
  auto rng = exl3::test::make_rng();
  std::uniform_real_distribution<double> ex(-14.0, 10.0);
  for (int i = 0; i < 20000; ++i) {
    const auto f = static_cast<float>((rng() & 1 ? -1 : 1) * std::exp2(ex(rng)));
    ASSERT_EQ(mx::float_to_e4m3(f), ref_encode(f)) << f;
  }
}

TEST(Mxfp8Codec, SaturatesAndHandlesSpecialInputs) {
  EXPECT_EQ(mx::float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(mx::float_to_e4m3(500.0f), 0x7E);
  EXPECT_EQ(mx::float_to_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(mx::float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(mx::float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), mx::kE4m3NaN);
  EXPECT_EQ(mx::float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(mx::float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(mx::float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(mx::float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);            // half the smallest: to even (0)
  EXPECT_EQ(mx::float_to_e4m3(std::ldexp(3.0f, -10)), 0x02);            // 1.5 units of 2^-9: to even (2)
  EXPECT_EQ(mx::float_to_e4m3(std::ldexp(5.0f, -10)), 0x02);            // 2.5 units: to even (2)
  EXPECT_EQ(mx::float_to_e4m3(std::ldexp(3.0f, -11)), 0x01);            // 0.75 units: up (1)
}

TEST(Mxfp8Codec, ScalesAcrossTheWholeRange) {
  for (int code = 0; code < 255; ++code) {
    EXPECT_EQ(static_cast<double>(mx::ue8m0_to_float(static_cast<uint8_t>(code))), std::ldexp(1.0, code - 127));
    if (code <= 246) {
      EXPECT_EQ(static_cast<double>(mx::ue8m0_to_float_x256(static_cast<uint8_t>(code))), std::ldexp(1.0, code - 119));
    }
  }
  EXPECT_TRUE(std::isnan(mx::ue8m0_to_float(255)));
  for (int e = -149; e <= 127; ++e) {
    for (double f : {1.0, 1.5, 1.999}) {
      const auto a = static_cast<float>(std::ldexp(f, e));
      if (a == 0.0f || std::isinf(a)) continue;
      int fe = 0;
      std::frexp(static_cast<double>(a), &fe);  // a = g * 2^fe, g in [0.5, 1)
      const int shared = std::clamp(fe - 1 - 8, -127, 127);
      EXPECT_EQ(mx::scale_code_for(a), shared + 127) << a;
    }
  }
  EXPECT_EQ(mx::scale_code_for(0.0f), 0);
}

TEST(Mxfp8Codec, BlocksEncodeAgainstTheSpecAndBoundTheError) {
  auto rng = exl3::test::make_rng();
  std::normal_distribution<double> nd;
  std::uniform_int_distribution<int> mag(-40, 40);
  for (int trial = 0; trial < 2000; ++trial) {
    float x[32];
    const int e = mag(rng);
    double amax = 0;
    for (auto& v : x) {
      v = static_cast<float>(std::ldexp(nd(rng), e));
      if (v == 0.0f) v = std::ldexp(1.0f, e);
      amax = std::max(amax, std::fabs(static_cast<double>(v)));
    }
    uint8_t q[32], s = 0;
    ASSERT_TRUE(mx::encode_block(x, 32, q, &s));
    int fe = 0;
    std::frexp(amax, &fe);
    const int shared = fe - 1 - 8;
    ASSERT_EQ(s, shared + 127);
    for (int i = 0; i < 32; ++i) {
      ASSERT_EQ(q[i], ref_encode(std::ldexp(static_cast<double>(x[i]), -shared))) << i;
      const double dq = mx::dequant(q[i], s);
      ASSERT_EQ(dq, ref_e4m3(q[i]) * std::ldexp(1.0, shared));
      // Half a unit in the last place of E4M3 (3 mantissa bits), or saturation at 448 * scale.
      const double scaled = std::fabs(std::ldexp(static_cast<double>(x[i]), -shared));
      if (scaled <= 448.0) {
        const double ulp = std::ldexp(1.0, std::max(-9, static_cast<int>(std::floor(std::log2(scaled))) - 3));
        ASSERT_LE(std::fabs(dq - x[i]), std::ldexp(ulp / 2, shared) * (1 + 1e-12)) << x[i];
      } else {
        ASSERT_EQ(std::fabs(dq), 448.0 * std::ldexp(1.0, shared));
      }
    }
  }
}

TEST(Mxfp8Codec, SpecialBlocks) {
  float zero[32] = {};
  uint8_t q[32], s = 99;
  ASSERT_TRUE(mx::encode_block(zero, 32, q, &s));
  EXPECT_EQ(s, 0);
  for (uint8_t v : q) EXPECT_EQ(v, 0);
  // fp32 subnormal block: the scale clamps at 2^-127 and values stay representable.
  float tiny[32];
  for (int i = 0; i < 32; ++i) tiny[i] = std::ldexp(static_cast<float>(i % 8 + 1), -136);
  ASSERT_TRUE(mx::encode_block(tiny, 32, q, &s));
  EXPECT_EQ(s, 0);
  // (i % 8 + 1) * 2^-9 * 2^-127: E4M3 subnormals (and 2^-6) times the smallest scale, exact.
  for (int i = 0; i < 32; ++i) EXPECT_EQ(mx::dequant(q[i], s), tiny[i]) << i;
  // NaN and infinities are refused, writing nothing.
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    float x[32];
    for (int i = 0; i < 32; ++i) x[i] = 1.0f + i;
    x[17] = bad;
    uint8_t qq[32] = {}, ss = 7;
    EXPECT_FALSE(mx::encode_block(x, 32, qq, &ss));
    EXPECT_EQ(ss, 7);
  }
  // The largest fp32 block stays within the scale codes the loaders accept.
  float big[32];
  for (auto& v : big) v = std::numeric_limits<float>::max();
  ASSERT_TRUE(mx::encode_block(big, 32, q, &s));
  EXPECT_EQ(s, 246);
}

}  // namespace
