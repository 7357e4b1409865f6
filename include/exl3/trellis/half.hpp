// IEEE binary16 / bfloat16 <-> binary32 conversions on raw bits, shared by host and device.
//
// EXL3 stores fp16 and its codebooks are defined by fp16 rounding (one __hadd / __hfma). The host
// needs the same round-to-nearest-even results as the GPU intrinsics, so the conversion is written
// on bits here once; device code uses the hardware instructions, which round identically.
#pragma once

#include <cstdint>
#include <cstring>

#include "exl3/trellis/hd.hpp"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace exl3::trellis {

EXL3_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

EXL3_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// fp16 bits -> fp32 (exact: every binary16 value is representable in binary32).
EXL3_HD float half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return bits_float(sign | 0x7F800000u | (man << 13));  // inf / nan
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return bits_float(sign);  // signed zero
  // Subnormal: value = man * 2^-24, exact in fp32.
  const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
  return (sign != 0u) ? -v : v;
#endif
}

// fp32 -> fp16 bits with round-to-nearest-even, overflow to inf, subnormals and NaN preserved
// (quiet). Matches __float2half_rn bit for bit.
EXL3_HD uint16_t float_to_half(float f) {
#if defined(__CUDA_ARCH__)
  return __half_as_ushort(__float2half_rn(f));
#else
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {                                       // inf or nan
    return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520
  if (abs >= 0x38800000u) {                                       // normal fp16 range
    const uint32_t mant_round = abs + 0xFFFu + ((abs >> 13) & 1u);  // RNE on the 13 dropped bits
    return static_cast<uint16_t>(sign | ((mant_round - 0x38000000u) >> 13));
  }
  // Subnormal fp16 (or zero): value in units of 2^-24, round half to even.
  const uint32_t exp = abs >> 23;
  if (exp < 102) return sign;  // below half of the smallest subnormal: rounds to zero
  const uint32_t man = (abs & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // man * 2^(exp-150) / 2^-24 = man >> (126 - exp)
  uint32_t q = man >> shift;
  const uint32_t rem = man & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
#endif
}

// bf16 bits -> fp32 (exact).
EXL3_HD float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// fp32 -> bf16 bits, round-to-nearest-even, NaN kept quiet.
EXL3_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// Round an fp32 value to the nearest fp16 value and return it as fp32.
EXL3_HD float round_to_half(float f) { return half_to_float(float_to_half(f)); }

}  // namespace exl3::trellis
