// OCP FP8 E4M3 ("E4M3FN": bias 7, no infinities, S.1111.111 is NaN, largest finite 448 =
// S.1111.110, subnormals m/8 * 2^-6) element conversions on bits, shared by host and device code:
// the MXFP8 weight codec (exl3/mxfp8/codec.hpp) and the FP8 KV cache (exl3/cpu/kv_codec.hpp).
#pragma once

#include <cstdint>

#include "exl3/trellis/half.hpp"
#include "exl3/trellis/hd.hpp"

namespace exl3::trellis {

inline constexpr float kE4m3Max = 448.0f;  // largest finite E4M3 value
inline constexpr uint8_t kE4m3NaN = 0x7F;

// E4M3 code -> fp32, exact (every E4M3 value is an fp32 value). NaN for S.1111.111.
EXL3_HD float e4m3_to_float(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t exp = (c >> 3) & 0xFu;
  const uint32_t man = c & 0x7u;
  if (exp == 0xFu && man == 0x7u) return bits_float(sign | 0x7FC00000u);
  if (exp != 0) return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
  // Subnormal (or zero): man * 2^-9, exact.
  return bits_float(sign | float_bits(static_cast<float>(man) * 0.001953125f));
}

// fp32 -> E4M3 code: round to nearest even, saturate to +-448 (finite inputs; NaN -> 0x7F).
EXL3_HD uint8_t float_to_e4m3(float f) {
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return kE4m3NaN;
  if (abs >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);  // >= 448 (and inf): saturate
  if (abs >= 0x3C800000u) {  // >= 2^-6: normal E4M3; RNE on the 20 dropped mantissa bits
    const uint32_t r = abs + 0x7FFFFu + ((abs >> 20) & 1u);
    const uint32_t code = (r >> 20) - (120u << 3);
    // Rounding up from just below 448 lands on 448 at most (0x7E): 464 would need abs >= 0x43E8.
    return static_cast<uint8_t>(sign | code);
  }
  // Subnormal range: value in units of 2^-9, round half to even (exact in fp32).
  const float units = bits_float(abs) * 512.0f;
  uint32_t q = static_cast<uint32_t>(units);
  const float rem = units - static_cast<float>(q);
  if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
  return static_cast<uint8_t>(sign | q);  // q == 8 is exactly the smallest normal 0x08
}

}  // namespace exl3::trellis
