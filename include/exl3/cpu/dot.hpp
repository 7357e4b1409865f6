// The fp32 dot product of the CPU reference matmuls (unquantized and MXFP8 linears): eight
// fixed-order lanes, so a row's result never depends on threading or batch size.
#pragma once

#include <cstdint>

namespace exl3::cpu {

inline float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace exl3::cpu
