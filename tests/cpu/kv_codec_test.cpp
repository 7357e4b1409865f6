// The quantized KV cache codec (exl3/cpu/kv_codec.hpp) on random groups with outliers: every
// decoded channel within the format's step of its input, the fp16 scale the one the encoder
// divides by, q4's nibble order, the code ranges, a group of zeros, and the format names.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cpu/kv_codec.hpp"
#include "exl3/trellis/half.hpp"
#include "test_support.hpp"

namespace exl3::cpu {
namespace {

constexpr KvFormat kQuantized[] = {KvFormat::kFp8, KvFormat::kQ8, KvFormat::kQ4};

// A group of normal channels with one outlier up to 20 sigma, at a random magnitude.
std::vector<float> random_group(std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> mag(-6.0f, 4.0f);
  const float scale = std::exp2(mag(rng));
  std::vector<float> x(kKvGroup);
  for (auto& v : x) v = nd(rng) * scale;
  x[rng() % kKvGroup] =
      (rng() % 2 ? 20.0f : -20.0f) * scale * std::uniform_real_distribution<float>(0.1f, 1.0f)(rng);
  return x;
}

TEST(KvCodec, RoundTripStaysWithinTheFormatsStep) {
  auto rng = test::make_rng();
  for (const KvFormat f : kQuantized) {
    for (int trial = 0; trial < 400; ++trial) {
      const auto x = random_group(rng);
      std::vector<uint8_t> codes(static_cast<size_t>(kv_code_bytes(f, kKvGroup)), 0xAB);
      const uint16_t s = kv_encode_group(f, x.data(), codes.data());
      float amax = 0.0f;
      for (const float v : x) amax = std::max(amax, std::fabs(v));
      ASSERT_EQ(s, trellis::float_to_half(amax / kv_code_max(f))) << kv_format_name(f);
      const float scale = trellis::half_to_float(s);
      std::vector<float> y(kKvGroup, NAN);
      kv_decode_group(f, codes.data(), s, y.data());
      for (int i = 0; i < kKvGroup; ++i) {
        // Integers: half a step, plus the clamp of a value the rounded scale puts past the top
        // code (scale rounding is at most 2^-11 relative). E4M3: 2^-4 relative (3 mantissa
        // bits, round to nearest) above its subnormals, whose step is 2^-9 of the scale.
        const float bound = f == KvFormat::kFp8 ? std::fabs(x[i]) * 0.0625f + scale * 0.001953125f
                                                : scale * 0.5f + amax * 0.001f;
        ASSERT_LE(std::fabs(y[i] - x[i]), bound)
            << kv_format_name(f) << " trial " << trial << " channel " << i;
      }
    }
  }
}

TEST(KvCodec, CodeRangesAndNibbleOrder) {
  auto rng = test::make_rng();
  const auto x = random_group(rng);
  std::vector<uint8_t> q4(16), q8(32);
  const uint16_t s4 = kv_encode_group(KvFormat::kQ4, x.data(), q4.data());
  const uint16_t s8 = kv_encode_group(KvFormat::kQ8, x.data(), q8.data());
  const float inv4 = kv_inverse_scale(s4);
  for (int i = 0; i < kKvGroup; ++i) {
    // The lower channel of each pair sits in the low nibble.
    const uint8_t nib = static_cast<uint8_t>(q4[i / 2] >> (4 * (i % 2)) & 0xF);
    EXPECT_EQ(nib, kv_encode(KvFormat::kQ4, x[i], inv4)) << i;
    EXPECT_GE(nib, 1);       // -7..7 + 8: 0 (-8) is never written
    EXPECT_NE(q8[i], 0x80);  // -128 is never written
  }
  (void)s8;
  // The largest |x| lands on the top code.
  int top = 0;
  for (int i = 1; i < kKvGroup; ++i)
    if (std::fabs(x[i]) > std::fabs(x[top])) top = i;
  EXPECT_EQ(std::fabs(kv_decode(KvFormat::kQ8, q8[top])), 127.0f);
}

TEST(KvCodec, ZeroGroupHasZeroScaleAndCodes) {
  for (const KvFormat f : kQuantized) {
    const std::vector<float> x(kKvGroup, 0.0f);
    std::vector<uint8_t> codes(static_cast<size_t>(kv_code_bytes(f, kKvGroup)), 0xFF);
    EXPECT_EQ(kv_encode_group(f, x.data(), codes.data()), 0);
    std::vector<float> y(kKvGroup, NAN);
    kv_decode_group(f, codes.data(), 0, y.data());
    for (const float v : y) EXPECT_EQ(v, 0.0f) << kv_format_name(f);
  }
}

TEST(KvCodec, NamesAndSizes) {
  for (const KvFormat f : {KvFormat::kNative, KvFormat::kFp8, KvFormat::kQ8, KvFormat::kQ4})
    EXPECT_EQ(parse_kv_format(kv_format_name(f)), f);
  EXPECT_FALSE(parse_kv_format("q5").has_value());
  EXPECT_FALSE(parse_kv_format("fp16").has_value());
  EXPECT_EQ(kv_code_bytes(KvFormat::kQ4, 128), 64);
  EXPECT_EQ(kv_code_bytes(KvFormat::kFp8, 128), 128);
  EXPECT_TRUE(kv_format_supports_head_dim(64));
  EXPECT_TRUE(kv_format_supports_head_dim(256));
  EXPECT_FALSE(kv_format_supports_head_dim(16));
  EXPECT_FALSE(kv_format_supports_head_dim(96));
}

}  // namespace
}  // namespace exl3::cpu
