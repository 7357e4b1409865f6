// Hadamard-128: the butterfly equals the explicit Sylvester matrix, is orthonormal and symmetric.
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "exl3/trellis/hadamard.hpp"
#include "test_support.hpp"

namespace tr = exl3::trellis;

TEST(Hadamard, MatchesExplicitMatrix) {
  auto rng = exl3::test::make_rng();
  std::normal_distribution<double> nd;
  std::vector<double> x(128), ref(128, 0.0);
  for (auto& v : x) v = nd(rng);
  for (int a = 0; a < 128; ++a) {
    for (int b = 0; b < 128; ++b) ref[a] += tr::had_sign(a, b) * x[b];
    ref[a] /= std::sqrt(128.0);
  }
  std::vector<double> y = x;
  tr::had128_inplace(y.data());
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], ref[i], 1e-12);
  std::vector<float> yf(x.begin(), x.end());
  tr::had128_inplace(yf.data());
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(yf[i], ref[i], 1e-5);
  // Involution: H/sqrt(128) is symmetric orthogonal, so applying it twice gives x back.
  tr::had128_inplace(y.data());
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], x[i], 1e-12);
}

TEST(Hadamard, SignFunction) {
  EXPECT_EQ(tr::had_sign(0, 0), 1);
  EXPECT_EQ(tr::had_sign(1, 1), -1);
  EXPECT_EQ(tr::had_sign(3, 3), 1);
  EXPECT_EQ(tr::had_sign(127, 1), -1);
}
