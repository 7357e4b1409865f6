// RoPE of one head's rotary part by one warp, shared by the MLA and DSA indexer kernels
// (mla_attention.cu, dsa_indexer.cu); the CPU reference is rope_mla in
// src/runtime/cpu_backend.cpp.
#pragma once

#include "exl3/cuda/mla.hpp"

namespace exl3::cuda::detail {

// x[0, 2 * half) rotated with cos = cs[0, half), sin = cs[half, 2 * half): pairs (i, i + half),
// or with `interleave` pairs (2i, 2i + 1) written back de-interleaved (evens, then odds). Every
// pair is read before any is written (interleaved pairs overlap the positions they go to), so the
// whole warp must call it; half <= kMlaMaxRopeHalf.
__device__ __forceinline__ void rope_part(float* x, const float* cs, int half, bool interleave,
                                          int lane) {
  constexpr int kPairs = kMlaMaxRopeHalf / 32;
  float a[kPairs], b[kPairs];
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
    const int i = lane + 32 * k;
    if (i < half) {
      a[k] = interleave ? x[2 * i] : x[i];
      b[k] = interleave ? x[2 * i + 1] : x[i + half];
    }
  }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
    const int i = lane + 32 * k;
    if (i < half) {
      const float c = cs[i], s = cs[half + i];
      x[i] = a[k] * c - b[k] * s;
      x[i + half] = b[k] * c + a[k] * s;
    }
  }
  __syncwarp();
}

}  // namespace exl3::cuda::detail
