// CPU reference path for one EXL3 linear layer: decode, reconstruction and the forward pass.
//
// This is the oracle every GPU kernel is tested against, so it is written to be exact first:
//   W_hat = decode(trellis)                              (fp16, bit-exact with exllamav3)
//   W     = diag(suh) . B_k . W_hat . B_n . diag(svh)     (original basis, fp64 math)
//   y     = had128(had128(x * suh) @ W_hat) * svh + bias  (fp32 accumulation)
// Tiles are decoded on the fly (a whole weight is never materialised by the forward pass) and
// the work is split over output-tile columns with TBB.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "exl3/trellis/codebook.hpp"

namespace exl3 {
class Exl3LinearData;
}

namespace exl3::cpu {

// Non-owning host view of an EXL3 linear's tensors.
struct LinearView {
  std::span<const uint16_t> trellis;  // int16 bits [in/16, out/16, 16*K]
  int64_t in_features = 0;
  int64_t out_features = 0;
  int bits = 0;
  trellis::Codebook codebook = trellis::Codebook::k3Inst;
  std::span<const uint16_t> suh;  // fp16 bits [in]
  std::span<const uint16_t> svh;  // fp16 bits [out]
  std::span<const float> bias;    // [out] or empty

  static LinearView of(const Exl3LinearData& data);
  // Throws exl3::Error when sizes are inconsistent (programming errors, not file errors: files
  // are validated at discovery).
  void validate() const;
};

enum class ActDType : uint8_t { kF16, kBF16, kF32 };

// Rotated-basis weight W_hat as fp16 bits, row-major [in, out].
std::vector<uint16_t> reconstruct_w_hat(const LinearView& w);

// Original-basis weight, row-major [in, out], computed in fp64 and rounded to fp32.
std::vector<float> reconstruct_weight(const LinearView& w);

// y[m, out] (fp32) = forward of x[m, in] given as `act` elements (fp16/bf16 bits or fp32).
void linear_forward(const LinearView& w, const void* x, ActDType act, int64_t m, float* y);

// Decodes one tile to fp32 values in row-major 16x16 order using the fastest available path
// (AVX2/F16C when the CPU has it). Bit-exact with trellis::decode_tile_bits.
void decode_tile_f32(const uint16_t* tile, int K, trellis::Codebook cb, float* out);

// Name of the decode path decode_tile_f32 uses on this CPU ("avx2" or "scalar").
const char* decode_path_name();

}  // namespace exl3::cpu
