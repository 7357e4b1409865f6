// EXL3 codebooks: 16-bit trellis state -> fp16 weight value (docs/format.md, Codebooks).
//
// Three codebooks exist, selected per tensor by marker tensors next to `<prefix>.trellis`:
//   3INST (no marker), MCG (`.mcg`), MUL1 (`.mul1`).
// Every function here reproduces exllamav3's GPU decode bit for bit. The fp16 rounding is the
// part that matters: 3INST/MCG round the exact fp32 sum of two fp16 halves once (= __hadd), MUL1
// rounds the exact fp32 value of h*k_inv + k_bias once (= __hfma; the product needs 22 bits and
// the sum stays within 22 bits, so fp32 holds it exactly).
#pragma once

#include <cstdint>

#include "exl3/trellis/half.hpp"
#include "exl3/trellis/hd.hpp"

namespace exl3::trellis {

enum class Codebook : uint8_t { k3Inst = 0, kMcg = 1, kMul1 = 2 };

inline constexpr int kNumCodebooks = 3;

// Locked multipliers (exllamav3 commit 0f2da5d). The marker tensors hold these values as int32.
inline constexpr uint32_t kMcgMult = 0xCBAC1FEDu;
inline constexpr uint32_t kMul1Mult = 0x83DCD12Du;
inline constexpr int32_t kMcgMarker = static_cast<int32_t>(kMcgMult);    // -877912083
inline constexpr int32_t kMul1Marker = static_cast<int32_t>(kMul1Mult);  // -2082680531

// 3INST constants (QTIP): x = s*a + b.
inline constexpr uint32_t k3InstMult = 89226354u;
inline constexpr uint32_t k3InstAdd = 64248484u;
// Shared by 3INST and MCG: keep sign + low 12 bits of each half, force exponent to 0b011xx.
inline constexpr uint32_t kHalfPairMask = 0x8FFF8FFFu;
inline constexpr uint32_t kHalfPairXor = 0x3B603B60u;
// MUL1 affine map from the byte sum (as fp16 1024 + bs) to the value, in fp16 bits.
inline constexpr uint16_t kMul1InvBits = 0x1EEE;   // 0.00676727294921875
inline constexpr uint16_t kMul1BiasBits = 0xC931;  // -10.3828125
// RMS of the 3INST codebook over all states; the quantizer divides suh by -this value.
inline constexpr double kCodebookScale = 1.24371088;

EXL3_HD const char* codebook_name(Codebook cb) {
  return cb == Codebook::kMcg ? "mcg" : (cb == Codebook::kMul1 ? "mul1" : "3inst");
}

// The 32-bit word whose two fp16 halves sum to the value (3INST and MCG).
EXL3_HD uint32_t half_pair_word(uint32_t x) { return (x & kHalfPairMask) ^ kHalfPairXor; }

EXL3_HD float half_pair_sum(uint32_t y) {
  // Both halves lie in +-[0.125, 2): their fp32 sum is exact, so one fp32->fp16 rounding
  // reproduces __hadd.
  return half_to_float(static_cast<uint16_t>(y & 0xFFFFu)) + half_to_float(static_cast<uint16_t>(y >> 16));
}

EXL3_HD uint16_t decode_3inst_bits(uint32_t state) {
  return float_to_half(half_pair_sum(half_pair_word(state * k3InstMult + k3InstAdd)));
}

EXL3_HD uint16_t decode_mcg_bits(uint32_t state) {
  return float_to_half(half_pair_sum(half_pair_word(state * kMcgMult)));
}

// Sum of the four bytes of x (0..1020); __dp4a(x, 0x01010101, 0) on the device.
EXL3_HD uint32_t byte_sum(uint32_t x) {
  return (x & 0xFFu) + ((x >> 8) & 0xFFu) + ((x >> 16) & 0xFFu) + (x >> 24);
}

EXL3_HD uint16_t decode_mul1_bits(uint32_t state) {
  const float h = 1024.0f + static_cast<float>(byte_sum(state * kMul1Mult));
  // Exact in fp32 (see header comment), so one rounding to fp16 equals __hfma.
  const float v = h * half_to_float(kMul1InvBits) + half_to_float(kMul1BiasBits);
  return float_to_half(v);
}

// Decode one 16-bit state (zero-extended) with the given codebook, as fp16 bits.
EXL3_HD uint16_t decode_bits(uint32_t state, Codebook cb) {
  state &= 0xFFFFu;
  switch (cb) {
    case Codebook::kMcg:
      return decode_mcg_bits(state);
    case Codebook::kMul1:
      return decode_mul1_bits(state);
    default:
      return decode_3inst_bits(state);
  }
}

// Decode to fp32 (the fp16 value, exactly).
EXL3_HD float decode(uint32_t state, Codebook cb) { return half_to_float(decode_bits(state, cb)); }

// Compile-time codebook variant, for kernels that instantiate per codebook.
template <Codebook CB>
EXL3_HD uint16_t decode_bits_t(uint32_t state) {
  if constexpr (CB == Codebook::kMcg) {
    return decode_mcg_bits(state);
  } else if constexpr (CB == Codebook::kMul1) {
    return decode_mul1_bits(state);
  } else {
    return decode_3inst_bits(state);
  }
}

}  // namespace exl3::trellis
