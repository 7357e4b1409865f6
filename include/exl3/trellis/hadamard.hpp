// Hadamard-128 (docs/format.md, Rotations): Sylvester order, H[a][b] = (-1)^popcount(a & b),
// normalised by 1/sqrt(128). EXL3 applies it block-diagonally to contiguous 128-channel groups on
// both sides of the decoded weight.
//
// The transform here is the in-place fp32 radix-2 butterfly (7 stages), scaled once at the end,
// which is what exllamav3's had_r_128 computes (up to fp32 summation order).
#pragma once

#include <cstdint>

#include "exl3/trellis/hd.hpp"

namespace exl3::trellis {

inline constexpr int kHadDim = 128;
inline constexpr float kHadScale = 0.088388347648318f;  // 1/sqrt(128)
inline constexpr double kHadScaleD = 0.08838834764831845;

// Sign of the Sylvester Hadamard entry H[a][b] (+1 or -1).
EXL3_HD constexpr int had_sign(int a, int b) { return (__builtin_popcount(a & b) & 1) ? -1 : 1; }

// In-place unnormalised Walsh-Hadamard transform of n (power of two) values.
template <typename T>
EXL3_HD void fwht_inplace(T* v, int n) {
  for (int h = 1; h < n; h <<= 1) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const T a = v[j];
        const T b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
    }
  }
}

// In-place normalised Hadamard-128 of one 128-element chunk, fp32 arithmetic.
EXL3_HD void had128_inplace(float* v) {
  fwht_inplace(v, kHadDim);
  for (int i = 0; i < kHadDim; ++i) v[i] *= kHadScale;
}

// fp64 variant, for reference computations (original-basis weights, tests).
EXL3_HD void had128_inplace(double* v) {
  fwht_inplace(v, kHadDim);
  for (int i = 0; i < kHadDim; ++i) v[i] *= kHadScaleD;
}

}  // namespace exl3::trellis
