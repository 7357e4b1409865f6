// MXFP8 weights: conversion from BF16/F16/F32 against the codec applied block by block in fp64
// bookkeeping, the reference matmul against an fp64 product of the dequantized matrix, the
// per-layer error, and the checkpoint form (round trip and every fail-closed case).
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "exl3/error.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/mxfp8/codec.hpp"
#include "exl3/mxfp8/weight.hpp"
#include "exl3/trellis/half.hpp"
#include "test_support.hpp"

namespace mx = exl3::mxfp8;
using exl3::DType;
using ::testing::HasSubstr;

namespace {

std::vector<float> random_matrix(std::mt19937_64& rng, int64_t rows, int64_t cols) {
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::uniform_real_distribution<float> row_mag(0.1f, 10.0f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float g = row_mag(rng);
    for (int64_t c = 0; c < cols; ++c) {
      float v = g * nd(rng);
      if (v == 0.0f) v = 1e-3f;
      w[static_cast<size_t>(r * cols + c)] = v;
    }
  }
  return w;
}

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

void expect_error(const std::function<void()>& f, const std::string& what) {
  try {
    f();
    FAIL() << "expected an error containing '" << what << "'";
  } catch (const exl3::Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr(what));
  }
}

TEST(Mxfp8Weight, ConvertsEachSourceTypeBlockByBlock) {
  auto rng = exl3::test::make_rng();
  const int64_t rows = 37, cols = 96;
  const auto w = random_matrix(rng, rows, cols);
  std::vector<uint16_t> bf(w.size()), hf(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    bf[i] = exl3::trellis::float_to_bf16(w[i]);
    hf[i] = exl3::trellis::float_to_half(w[i]);
  }
  struct Case {
    DType t;
    const std::byte* data;
    std::function<float(size_t)> elem;
  };
  const std::vector<Case> cases = {
      {DType::kF32, bytes_of(w).data(), [&](size_t i) { return w[i]; }},
      {DType::kBF16, bytes_of(bf).data(), [&](size_t i) { return exl3::trellis::bf16_to_float(bf[i]); }},
      {DType::kF16, bytes_of(hf).data(), [&](size_t i) { return exl3::trellis::half_to_float(hf[i]); }},
  };
  for (const auto& c : cases) {
    const auto q = mx::Weight::quantize("layer", c.data, c.t, rows, cols);
    ASSERT_EQ(q.rows(), rows);
    ASSERT_EQ(q.cols(), cols);
    EXPECT_EQ(q.bytes(), static_cast<size_t>(rows * cols + rows * cols / 32));
    const auto dq = q.dequantize();
    double err2 = 0, ref2 = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < cols / 32; ++b) {
        double amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(static_cast<double>(c.elem(static_cast<size_t>(r * cols + b * 32 + i)))));
        int fe = 0;
        std::frexp(amax, &fe);
        const int shared = fe - 1 - 8;
        ASSERT_EQ(q.scales()[r * (cols / 32) + b], shared + 127);
        for (int i = 0; i < 32; ++i) {
          const size_t idx = static_cast<size_t>(r * cols + b * 32 + i);
          const double x = c.elem(idx);
          const double d = dq[idx];
          // |error| <= half an E4M3 ulp of the scaled value (never saturated: amax < 512 * 2^shared
          // only saturates above 448, checked via the code).
          const double scaled = std::fabs(std::ldexp(x, -shared));
          const double ulp = std::ldexp(1.0, std::max(-9, static_cast<int>(std::floor(std::log2(scaled))) - 3));
          if (scaled <= 448.0) {
            ASSERT_LE(std::fabs(d - x), std::ldexp(ulp / 2, shared) * (1 + 1e-12));
          }
          err2 += (d - x) * (d - x);
          ref2 += x * x;
        }
      }
    }
    const auto e = mx::conversion_error(q, c.data, c.t);
    EXPECT_NEAR(e.rel_l2, std::sqrt(err2 / ref2), 1e-9);
    EXPECT_GT(e.rel_l2, 0.0);
    EXPECT_LT(e.rel_l2, 0.04);  // 3 mantissa bits: ~2^-4 / sqrt(3) worst case per element
    EXPECT_GT(e.max_abs, 0.0);
  }
}

TEST(Mxfp8Weight, MatmulMatchesFp64ProductOfTheDequantizedMatrix) {
  auto rng = exl3::test::make_rng();
  const int64_t rows = 70, cols = 160;
  const auto w = random_matrix(rng, rows, cols);
  const auto q = mx::Weight::quantize_f32("m", w, rows, cols);
  const auto dq = q.dequantize();
  std::normal_distribution<float> nd;
  std::vector<float> bias(static_cast<size_t>(rows));
  for (auto& b : bias) b = nd(rng);
  for (int64_t m : {1, 3, 9}) {
    std::vector<float> x(static_cast<size_t>(m * cols)), y(static_cast<size_t>(m * rows));
    for (auto& v : x) v = nd(rng);
    q.matmul_t(x.data(), m, y.data(), bias);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        double ref = bias[static_cast<size_t>(r)];
        double mag = std::fabs(ref);
        for (int64_t c = 0; c < cols; ++c) {
          const double p = static_cast<double>(x[static_cast<size_t>(i * cols + c)]) * dq[static_cast<size_t>(r * cols + c)];
          ref += p;
          mag += std::fabs(p);
        }
        ASSERT_NEAR(y[static_cast<size_t>(i * rows + r)], ref, 1e-6 * mag + 1e-30) << i << "," << r;
      }
    }
  }
  std::vector<float> x(static_cast<size_t>(cols), 1.0f), y(static_cast<size_t>(rows));
  expect_error([&] { q.matmul_t(x.data(), 1, y.data(), std::vector<float>(3)); }, "bias has 3 values");
}

TEST(Mxfp8Weight, ConversionFailsClosed) {
  std::vector<float> w(4 * 48, 0.5f);
  expect_error([&] { mx::Weight::quantize_f32("model.layers.0.mlp.down_proj", w, 4, 48); },
               "model.layers.0.mlp.down_proj: input width 48 is not a positive multiple of 32");
  std::vector<float> w2(4 * 64, 0.5f);
  w2[2 * 64 + 40] = std::nanf("");
  expect_error([&] { mx::Weight::quantize_f32("q", w2, 4, 64); }, "q: element [2, 40] is nan");
  w2[2 * 64 + 40] = -INFINITY;
  expect_error([&] { mx::Weight::quantize_f32("q", w2, 4, 64); }, "element [2, 40] is -inf");
  std::vector<int32_t> ints(64);
  expect_error([&] { mx::Weight::quantize("i", reinterpret_cast<const std::byte*>(ints.data()), DType::kI32, 1, 64); },
               "cannot convert I32 to MXFP8");
  expect_error([&] { mx::Weight::quantize_f32("z", w2, 4, 32); }, "256 values for a [4, 32] matrix");
}

class Mxfp8Store : public ::testing::Test {
 protected:
  // Writes `values` / `scales` as the checkpoint form of "lin" and opens the store.
  exl3::TensorStore write(DType vt, std::vector<int64_t> vshape, const std::vector<uint8_t>& values, DType st,
                          std::vector<int64_t> sshape, const std::vector<uint8_t>& scales, bool with_scale = true) {
    exl3::SafetensorsWriter wr;
    wr.add("lin.weight", vt, vshape, std::span<const uint8_t>(values));
    if (with_scale) wr.add("lin.weight_scale", st, sshape, std::span<const uint8_t>(scales));
    wr.write(dir_ / "model.safetensors");
    return exl3::TensorStore::open(dir_.path());
  }
  exl3::test::TempDir dir_;
};

TEST_F(Mxfp8Store, RoundTripsThroughACheckpoint) {
  auto rng = exl3::test::make_rng();
  const auto w = random_matrix(rng, 24, 128);
  const auto q = mx::Weight::quantize_f32("lin", w, 24, 128);
  std::vector<uint8_t> v(q.values(), q.values() + 24 * 128), s(q.scales(), q.scales() + 24 * 4);
  const auto store = write(DType::kF8E4M3, {24, 128}, v, DType::kU8, {24, 4}, s);
  EXPECT_TRUE(mx::Weight::stored_in(store, "lin"));
  EXPECT_FALSE(mx::Weight::stored_in(store, "other"));
  const auto l = mx::Weight::load(store, "lin", 24, 128);
  EXPECT_EQ(l.dequantize(), q.dequantize());
  const auto store2 = write(DType::kU8, {24, 128}, v, DType::kU8, {24, 4}, s);  // U8 codes accepted
  EXPECT_EQ(mx::Weight::load(store2, "lin").dequantize(), q.dequantize());
}

TEST_F(Mxfp8Store, LoaderFailsClosed) {
  std::vector<uint8_t> v(8 * 64, 0x38), s(8 * 2, 120);
  {
    const auto st = write(DType::kF8E4M3, {8, 64}, v, DType::kU8, {8, 2}, s);
    expect_error([&] { mx::Weight::load(st, "lin", 8, 128); }, "is [8, 64], expected [8, 128]");
  }
  {
    const auto st = write(DType::kI8, {8, 64}, v, DType::kU8, {8, 2}, s);
    expect_error([&] { mx::Weight::load(st, "lin"); }, "is I8 of rank 2; an MXFP8 weight is a 2-D F8_E4M3");
  }
  {
    const auto st = write(DType::kF8E4M3, {8, 64}, v, DType::kU8, {8, 4}, std::vector<uint8_t>(32, 120));
    expect_error([&] { mx::Weight::load(st, "lin"); }, "'lin.weight_scale' is U8 [8, 4]; expected U8 [8, 2]");
  }
  {
    const auto st = write(DType::kF8E4M3, {8, 64}, v, DType::kI8, {8, 2}, s);
    expect_error([&] { mx::Weight::load(st, "lin"); }, "expected U8 [8, 2]");
  }
  {
    std::vector<uint8_t> v2(8 * 48, 0x38), s2(8, 120);
    const auto st = write(DType::kF8E4M3, {8, 48}, v2, DType::kU8, {8, 1}, s2);
    expect_error([&] { mx::Weight::load(st, "lin"); }, "input width 48 is not a positive multiple of 32");
  }
  {
    auto bad = v;
    bad[3 * 64 + 5] = 0xFF;
    const auto st = write(DType::kF8E4M3, {8, 64}, bad, DType::kU8, {8, 2}, s);
    expect_error([&] { mx::Weight::load(st, "lin"); }, "E4M3 NaN code 0xFF at [3, 5]");
  }
  {
    auto bad = s;
    bad[7 * 2 + 1] = 250;
    const auto st = write(DType::kF8E4M3, {8, 64}, v, DType::kU8, {8, 2}, bad);
    expect_error([&] { mx::Weight::load(st, "lin"); }, "scale code 250 at [7, 1]");
  }
  {
    const auto st = write(DType::kF8E4M3, {8, 64}, v, DType::kU8, {8, 2}, s, false);
    expect_error([&] { mx::Weight::load(st, "lin"); }, "'lin.weight_scale' is missing");
  }
}

}  // namespace
