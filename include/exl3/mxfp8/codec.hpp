// MXFP8 (OCP Microscaling, E4M3 elements, block 32) arithmetic on bits, shared by the CPU path
// (conversion, reference dequant) and the CUDA kernels: the single source of truth.
//
// A weight [out, in] is stored as two planes:
//   values  uint8 [out, in]      OCP FP8 E4M3 ("E4M3FN": bias 7, no infinities, S.1111.111 is
//                                NaN, largest finite 448 = S.1111.110, subnormals m/8 * 2^-6)
//   scales  uint8 [out, in / 32] UE8M0: 2^(e - 127), e = 255 is NaN (never written)
// w[o, i] = e4m3(values[o, i]) * 2^(scales[o, i / 32] - 127). Blocks run along the input
// dimension, so `in` must be a multiple of 32.
//
// Encoding (OCP MX v1.0, section 6.3): shared exponent = floor(log2(amax)) - 8, where 8 is E4M3's
// emax, clamped to UE8M0's range [-127, 127]; each element is x / 2^shared rounded to nearest
// even in E4M3 and *saturated* to +-448 (amax / 2^shared lies in [256, 512), so the block's
// largest values can exceed 448: OCP MX clamps them, as we do). An all-zero block gets e = 0.
// Non-finite inputs (NaN, +-Inf) have no MXFP8 encoding worth keeping: encode_block reports them
// and the converters fail naming the tensor (a NaN weight is a broken checkpoint, never silently
// rewritten). Negative zero encodes as 0x80 and decodes as -0.0.
#pragma once

#include <cstdint>

#include "exl3/trellis/e4m3.hpp"
#include "exl3/trellis/half.hpp"
#include "exl3/trellis/hd.hpp"

namespace exl3::mxfp8 {

inline constexpr int kBlock = 32;    // elements per UE8M0 scale
inline constexpr int kE4m3Emax = 8;  // exponent of the largest E4M3 binade
using trellis::kE4m3Max;             // largest finite E4M3 value
using trellis::kE4m3NaN;
inline constexpr uint8_t kUe8m0NaN = 0xFF;

// One block as a plain struct (the logical unit; checkpoints and device buffers keep the two
// planes separate so value rows stay contiguous for 16-byte loads).
struct Block {
  uint8_t values[kBlock];
  uint8_t scale;
};
static_assert(sizeof(Block) == kBlock + 1, "MXFP8 block is 32 E4M3 bytes + 1 UE8M0 byte");
static_assert(sizeof(uint8_t) == 1);

// The element codec lives with the other number formats (exl3/trellis/e4m3.hpp): the FP8 KV
// cache uses it too.
using trellis::e4m3_to_float;
using trellis::float_to_e4m3;

// The same code reinterpreted as fp16 bits: the exponent field shifts into fp16's (bias 15 vs 7),
// so the fp16 value is exactly e4m3 * 2^-8, subnormals included (NaN codes become 480, which
// the encoder never writes). Kernels decode with one shift and fold 2^8 into the block scale.
EXL3_HD uint16_t e4m3_to_half_bits_scaled(uint8_t c) {
  return static_cast<uint16_t>(((c & 0x80u) << 8) | ((c & 0x7Fu) << 7));
}

// UE8M0 code -> 2^(e - 127) as fp32 (2^-127 is an fp32 subnormal, still exact). NaN for 255.
EXL3_HD float ue8m0_to_float(uint8_t e) {
  if (e == kUe8m0NaN) return trellis::bits_float(0x7FC00000u);
  if (e == 0) return trellis::bits_float(0x00400000u);
  return trellis::bits_float(static_cast<uint32_t>(e) << 23);
}

// 2^(e - 119) = ue8m0 * 2^8: the factor for values decoded by e4m3_to_half_bits_scaled. In
// fp32's normal range for every code the encoder writes (e <= 246).
EXL3_HD float ue8m0_to_float_x256(uint8_t e) {
  const int ex = static_cast<int>(e) - 119 + 127;  // biased fp32 exponent
  if (ex <= 0) return trellis::bits_float(0x00800000u >> (1 - ex));
  return trellis::bits_float(static_cast<uint32_t>(ex) << 23);
}

// floor(log2(|a|)) for a finite non-zero fp32 value (subnormals included).
EXL3_HD int floor_log2(float a) {
  const uint32_t abs = trellis::float_bits(a) & 0x7FFFFFFFu;
  const int exp = static_cast<int>(abs >> 23);
  if (exp != 0) return exp - 127;
  int lz = 0;  // subnormal: position of the leading mantissa bit
  for (uint32_t m = abs; (m & 0x400000u) == 0; m <<= 1) ++lz;
  return -127 - lz;
}

// The UE8M0 scale code for a block with absolute maximum `amax` (finite, >= 0).
EXL3_HD uint8_t scale_code_for(float amax) {
  if (!(amax > 0.0f)) return 0;
  int shared = floor_log2(amax) - kE4m3Emax;
  if (shared < -127) shared = -127;
  if (shared > 127) shared = 127;  // unreachable for fp32 (log2 < 128), kept for clarity
  return static_cast<uint8_t>(shared + 127);
}

// Encodes n <= 32 values (one block; a short tail is not used by the format but keeps the
// function total). Returns false, writing nothing, when a value is NaN or infinite.
EXL3_HD bool encode_block(const float* x, int n, uint8_t* values, uint8_t* scale) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const uint32_t abs = trellis::float_bits(x[i]) & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) return false;
    const float a = trellis::bits_float(abs);
    amax = a > amax ? a : amax;
  }
  const uint8_t e = scale_code_for(amax);
  // 1 / 2^(e-127) = 2^(127-e): e in 0..254 gives exponents -127..127; multiply in two exact
  // power-of-two steps so 2^127 (e = 0) needs no fp32 overflow handling.
  const int inv = 127 - static_cast<int>(e);
  const float half_step = trellis::bits_float(static_cast<uint32_t>(inv / 2 + 127) << 23);
  const float rest = trellis::bits_float(static_cast<uint32_t>(inv - inv / 2 + 127) << 23);
  for (int i = 0; i < n; ++i) values[i] = float_to_e4m3((x[i] * half_step) * rest);
  *scale = e;
  return true;
}

// The dequantized value of one element.
EXL3_HD float dequant(uint8_t value, uint8_t scale) {
  return e4m3_to_float(value) * ue8m0_to_float(scale);
}

}  // namespace exl3::mxfp8
