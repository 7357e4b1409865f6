// The quantized KV cache formats, on bits, shared by the CPU engine's cache (runtime/kv_cache)
// and the CUDA store and attention kernels: the one definition both sides encode and decode by.
//
// A cache slot holds, per KV head, head_dim channels cut into groups of 32. Each group keeps one
// fp16 scale s and 32 codes; channel i decodes to decode(code_i) * s:
//   fp8  OCP E4M3 codes, s = amax / 448 (the largest finite E4M3): 8.5 bits per channel
//   q8   signed int8 codes in -127..127, s = amax / 127: 8.5 bits
//   q4   signed int4 codes in -7..7 stored as nibbles 1..15 (code + 8), two channels per byte, the
//        lower channel in the low nibble, s = amax / 7: 4.5 bits
// where amax is the group's largest |x| and s is rounded to fp16 (round to nearest even) before
// the codes are made from x / s, so encoder and decoder use the same s. A group of zeros has
// s = 0 and zero codes.
//
// In the integer formats keys are rotated before they are quantized: each KV head's key goes
// through the normalised Sylvester Hadamard transform of size head_dim (H = H^T = H^-1), which
// spreads RoPE's large-magnitude channels over the whole head so a group's scale is not set by one
// channel. Attention applies the same transform to the queries, and q . k = (Hq) . (Hk), so the
// scores need no inverse. (Measured on keys with one channel 12x the rest: the rotation halves the
// attention error of q8 and cuts q4's by a third, but raises fp8's by a third, whose per-element
// exponent already absorbs outliers; so fp8 keys are stored unrotated.) Values are never rotated:
// that would need the inverse transform on every attention output.
//
// head_dim must be a power of two >= 32 for the quantized formats (kv_format_supports_head_dim).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#include "exl3/trellis/e4m3.hpp"
#include "exl3/trellis/half.hpp"
#include "exl3/trellis/hd.hpp"

namespace exl3::cpu {

enum class KvFormat : uint8_t {
  kNative,  // the engine's own precision: fp32 on the CPU, fp16 on CUDA
  kFp8,
  kQ8,
  kQ4,
};

inline constexpr int kKvGroup = 32;  // channels per fp16 scale

EXL3_HD bool kv_quantized(KvFormat f) {
  return f != KvFormat::kNative;
}

// "auto", "fp8", "q8", "q4" (the names the CLI and the server take).
inline std::string_view kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::kFp8:
      return "fp8";
    case KvFormat::kQ8:
      return "q8";
    case KvFormat::kQ4:
      return "q4";
    case KvFormat::kNative:
      break;
  }
  return "auto";
}

inline std::optional<KvFormat> parse_kv_format(std::string_view s) {
  for (const KvFormat f : {KvFormat::kNative, KvFormat::kFp8, KvFormat::kQ8, KvFormat::kQ4}) {
    if (s == kv_format_name(f)) return f;
  }
  return std::nullopt;
}

// Whether keys are Hadamard-rotated before they are quantized (and queries before attention).
EXL3_HD bool kv_rotates_keys(KvFormat f) {
  return f == KvFormat::kQ8 || f == KvFormat::kQ4;
}

EXL3_HD int kv_code_bits(KvFormat f) {
  return f == KvFormat::kQ4 ? 4 : 8;
}

// Code bytes of `channels` channels (a multiple of kKvGroup) in a quantized format.
EXL3_HD int64_t kv_code_bytes(KvFormat f, int64_t channels) {
  return channels * kv_code_bits(f) / 8;
}

// Whether a quantized cache can hold heads of this size (groups of 32 and a Hadamard size).
inline bool kv_format_supports_head_dim(int64_t head_dim) {
  return head_dim >= kKvGroup && head_dim <= 1024 && (head_dim & (head_dim - 1)) == 0;
}

// The largest code magnitude: amax maps to it.
EXL3_HD float kv_code_max(KvFormat f) {
  return f == KvFormat::kFp8 ? trellis::kE4m3Max : (f == KvFormat::kQ8 ? 127.0f : 7.0f);
}

// The fp16 scale of a group whose largest |x| is amax (finite, >= 0).
EXL3_HD uint16_t kv_scale_bits(KvFormat f, float amax) {
  return trellis::float_to_half(amax / kv_code_max(f));
}

// 1 / s for the encoder (0 for a zero scale, so a zero group gets zero codes).
EXL3_HD float kv_inverse_scale(uint16_t scale_bits) {
  const float s = trellis::half_to_float(scale_bits);
  return s > 0.0f ? 1.0f / s : 0.0f;
}

// The code of x given 1 / s: an E4M3 byte, an int8 byte, or a q4 nibble (0..15).
EXL3_HD uint8_t kv_encode(KvFormat f, float x, float inv_scale) {
  const float y = x * inv_scale;
  if (f == KvFormat::kFp8) return trellis::float_to_e4m3(y);
  const float m = kv_code_max(f);
  const float r = rintf(fminf(fmaxf(y, -m), m));  // rint: round half to even on both sides
  const int c = static_cast<int>(r);
  return f == KvFormat::kQ8 ? static_cast<uint8_t>(static_cast<int8_t>(c))
                            : static_cast<uint8_t>(c + 8);
}

// The value of a code before its scale (q4: the nibble).
EXL3_HD float kv_decode(KvFormat f, uint8_t code) {
  if (f == KvFormat::kFp8) return trellis::e4m3_to_float(code);
  if (f == KvFormat::kQ8) return static_cast<float>(static_cast<int8_t>(code));
  return static_cast<float>(static_cast<int>(code & 0xFu) - 8);
}

// 1 / sqrt(n) for the Hadamard sizes (powers of two), computed in double and rounded once.
EXL3_HD float kv_rotation_scale(int n) {
  return static_cast<float>(1.0 / sqrt(static_cast<double>(n)));
}

// Host encoding of one group of 32 channels: codes (32 bytes, or 16 for q4) and the scale.
inline uint16_t kv_encode_group(KvFormat f, const float* x, uint8_t* codes) {
  float amax = 0.0f;
  for (int i = 0; i < kKvGroup; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const uint16_t s = kv_scale_bits(f, amax);
  const float inv = kv_inverse_scale(s);
  if (f == KvFormat::kQ4) {
    for (int i = 0; i < kKvGroup; i += 2) {
      codes[i / 2] =
          static_cast<uint8_t>(kv_encode(f, x[i], inv) | (kv_encode(f, x[i + 1], inv) << 4));
    }
  } else {
    for (int i = 0; i < kKvGroup; ++i) codes[i] = kv_encode(f, x[i], inv);
  }
  return s;
}

// Host decoding of one group.
inline void kv_decode_group(KvFormat f, const uint8_t* codes, uint16_t scale_bits, float* x) {
  const float s = trellis::half_to_float(scale_bits);
  for (int i = 0; i < kKvGroup; ++i) {
    const uint8_t c =
        f == KvFormat::kQ4 ? static_cast<uint8_t>(codes[i / 2] >> (4 * (i & 1))) : codes[i];
    x[i] = kv_decode(f, c) * s;
  }
}

}  // namespace exl3::cpu
