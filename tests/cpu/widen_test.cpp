// widen_to_f32 against the scalar conversions: every fp16 bit pattern (subnormals, infinities and
// NaNs included), at every offset of a misaligned buffer and for lengths around the vector width;
// bf16 and fp32 pass through.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/cpu/widen.hpp"
#include "exl3/trellis/half.hpp"
#include "test_support.hpp"

namespace exl3::cpu {
namespace {

std::vector<std::byte> bytes_of(const std::vector<uint16_t>& v, size_t offset) {
  std::vector<std::byte> b(offset + 2 * v.size());
  if (!v.empty()) std::memcpy(b.data() + offset, v.data(), 2 * v.size());  // empty: data() may be null
  return b;
}

void expect_same(float got, float want, uint16_t bits) {
  if (std::isnan(want)) {
    EXPECT_TRUE(std::isnan(got)) << "fp16 bits " << bits;
  } else {
    uint32_t g, w;
    std::memcpy(&g, &got, 4);
    std::memcpy(&w, &want, 4);
    EXPECT_EQ(g, w) << "fp16 bits " << bits;
  }
}

TEST(Widen, EveryHalfIsExact) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (const size_t offset : {0u, 1u, 2u}) {  // unaligned starts too
    const auto src = bytes_of(all, offset);
    std::vector<float> out(all.size(), -1.0f);
    widen_to_f32(src.data() + offset, DType::kF16, static_cast<int64_t>(all.size()), out.data());
    for (size_t i = 0; i < all.size(); ++i)
      expect_same(out[i], trellis::half_to_float(all[i]), all[i]);
  }
}

TEST(Widen, TailsAndOtherTypes) {
  auto rng = exl3::test::make_rng();
  for (const int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 100}) {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    for (auto& x : h)
      x = trellis::float_to_half(static_cast<float>(rng() % 20001) / 100.0f - 100.0f);
    const auto src = bytes_of(h, 0);
    std::vector<float> out(static_cast<size_t>(n) + 1, 12345.0f);  // the element past n stays
    widen_to_f32(src.data(), DType::kF16, n, out.data());
    for (int64_t i = 0; i < n; ++i) expect_same(out[i], trellis::half_to_float(h[i]), h[i]);
    EXPECT_EQ(out[static_cast<size_t>(n)], 12345.0f);
    widen_to_f32(src.data(), DType::kBF16, n, out.data());
    for (int64_t i = 0; i < n; ++i) expect_same(out[i], trellis::bf16_to_float(h[i]), h[i]);
  }
  const std::vector<float> f = {1.5f, -0.0f, 3.25e-8f};
  std::vector<float> out(3);
  widen_to_f32(reinterpret_cast<const std::byte*>(f.data()), DType::kF32, 3, out.data());
  EXPECT_EQ(out, f);
}

}  // namespace
}  // namespace exl3::cpu
