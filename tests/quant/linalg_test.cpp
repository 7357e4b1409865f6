// White-box checks of the quantizer's dense linear algebra and block rotations.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "exl3/trellis/hadamard.hpp"
#include "quant/linalg.hpp"
#include "quant/rotate.hpp"
#include "test_support.hpp"

namespace {

namespace d = exl3::quant::detail;
namespace tr = exl3::trellis;

// A random SPD matrix X^T X / m + 0.1 I of size n.
std::vector<double> random_spd(std::mt19937_64& rng, int64_t n) {
  std::normal_distribution<double> nd(0.0, 1.0);
  const int64_t m = n + 8;
  std::vector<double> x(static_cast<size_t>(m * n));
  for (auto& v : x) v = nd(rng);
  std::vector<double> h(static_cast<size_t>(n * n), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t a = 0; a < n; ++a) {
      for (int64_t b = 0; b < n; ++b) h[a * n + b] += x[r * n + a] * x[r * n + b] / m;
    }
  }
  for (int64_t a = 0; a < n; ++a) h[a * n + a] += 0.1;
  return h;
}

TEST(QuantLinalg, CholeskyReproducesMatrix) {
  auto rng = exl3::test::make_rng();
  for (int64_t n : {1, 16, 80, 160}) {  // 80 and 160: partial last 64-column panel
    const auto h = random_spd(rng, n);
    auto c = h;
    ASSERT_TRUE(d::cholesky_lower(c.data(), n)) << n;
    double max_err = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        if (j > i) {
          ASSERT_EQ(c[i * n + j], 0.0);
        }
        double s = 0.0;
        for (int64_t t = 0; t < n; ++t) s += c[i * n + t] * c[j * n + t];
        max_err = std::max(max_err, std::abs(s - h[i * n + j]));
      }
    }
    EXPECT_LT(max_err, 1e-10) << n;
  }
}

TEST(QuantLinalg, CholeskyRejectsIndefiniteMatrix) {
  std::vector<double> a = {1.0, 2.0, 2.0, 1.0};  // eigenvalues 3 and -1
  EXPECT_FALSE(d::cholesky_lower(a.data(), 2));
  std::vector<double> nan = {std::nan("")};
  EXPECT_FALSE(d::cholesky_lower(nan.data(), 1));
}

// L . blockdiag(C) must give back C below the diagonal blocks, and L must be strictly block-lower.
TEST(QuantLinalg, BlockLdlFactorsCholesky) {
  auto rng = exl3::test::make_rng();
  const int64_t n = 64;
  auto c = random_spd(rng, n);
  ASSERT_TRUE(d::cholesky_lower(c.data(), n));
  const auto l = d::block_ldl_from_cholesky(c.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t bi = i / 16, bj = j / 16;
      if (bj >= bi) {
        ASSERT_EQ(l[i * n + j], 0.0f) << i << "," << j;
        continue;
      }
      double s = 0.0;
      for (int64_t t = 16 * bj; t < 16 * bj + 16; ++t) s += l[i * n + t] * c[t * n + j];
      ASSERT_NEAR(s, c[i * n + j], 1e-5 * (1.0 + std::abs(c[i * n + j]))) << i << "," << j;
    }
  }
}

TEST(QuantRotate, MatchesSylvesterMatrixAndIsAnInvolution) {
  auto rng = exl3::test::make_rng();
  std::normal_distribution<double> nd(0.0, 1.0);
  const int64_t rows = 256, cols = 128;
  std::vector<double> x(static_cast<size_t>(rows * cols));
  for (auto& v : x) v = nd(rng);
  auto left = x;
  d::had_left(left.data(), rows, cols);
  for (int64_t r : {0, 5, 130, 255}) {
    for (int64_t c : {0, 77}) {
      const int64_t blk = r / 128 * 128;
      double s = 0.0;
      for (int64_t t = 0; t < 128; ++t)
        s += tr::had_sign(static_cast<int>(r - blk), static_cast<int>(t)) * x[(blk + t) * cols + c];
      EXPECT_NEAR(left[r * cols + c], s * tr::kHadScaleD, 1e-12);
    }
  }
  d::had_left(left.data(), rows, cols);
  auto right = x;
  d::had_right(right.data(), rows, cols);
  d::had_right(right.data(), rows, cols);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(left[i], x[i], 1e-12);
    ASSERT_NEAR(right[i], x[i], 1e-12);
  }
}

}  // namespace
