// Register decode of MXFP8 for the kernels: four E4M3 codes in a 32-bit word -> four fp32
// values times 2^-8 (exact; the factor is folded into the block scale, see
// mxfp8::ue8m0_to_float_x256), via the fp16 bit trick of mxfp8::e4m3_to_half_bits_scaled applied
// to two codes per 32-bit operation.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "exl3/mxfp8/codec.hpp"

namespace exl3::cuda::detail {

// Two codes (bytes 0 and 2 of `pair`, bytes 1 and 3 zero) -> half2 bits of e4m3 * 2^-8.
__device__ __forceinline__ uint32_t e4m3x2_to_half2_bits(uint32_t pair) {
  return ((pair & 0x00800080u) << 8) | ((pair & 0x007F007Fu) << 7);
}

// Codes b0..b3 of `word` -> out[0..3] = e4m3(b_i) * 2^-8.
__device__ __forceinline__ void decode4(uint32_t word, float* out) {
  const uint32_t lo = e4m3x2_to_half2_bits(__byte_perm(word, 0u, 0x4140u));
  const uint32_t hi = e4m3x2_to_half2_bits(__byte_perm(word, 0u, 0x4342u));
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

// Four codes stored in the order {c0, c2, c1, c3} (mxfp8_tiles.hpp) -> two bf16x2 words of
// e4m3 * 2^-120: lo = (c0, c1), hi = (c2, c3). The sign moves to bit 15 and the 7 exponent and
// mantissa bits to bits 10..4, so bf16's exponent field holds E4M3's (bias 127 vs 7) and the
// value is exact for every non-NaN code, E4M3 subnormals becoming bf16 subnormals.
__device__ __forceinline__ void e4m3x4_to_bf16x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  lo = ((word << 8) & 0x80008000u) | ((word << 4) & 0x07F007F0u);
  hi = (word & 0x80008000u) | ((word >> 4) & 0x07F007F0u);
}

// Eight BF16 values (a uint4) -> fp32.
__device__ __forceinline__ void bf16x8_to_float(uint4 v, float* out) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);
    out[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

}  // namespace exl3::cuda::detail
