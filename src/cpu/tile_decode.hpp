// Internal: the individual tile decode paths behind exl3::cpu::decode_tile_f32, exposed so tests
// can check each one against the shared trellis header.
#pragma once

#include <cstdint>

#include "exl3/trellis/codebook.hpp"

namespace exl3::cpu::detail {

// Portable path. Output: fp32 values, row-major 16x16.
void decode_tile_scalar(const uint16_t* tile, int K, trellis::Codebook cb, float* out);

// AVX2/F16C path; returns false (and writes nothing) when the CPU lacks it.
bool decode_tile_vector(const uint16_t* tile, int K, trellis::Codebook cb, float* out);

// The AVX2/F16C codebook decode of n (multiple of 8) 16-bit states; false when unavailable.
bool decode_states_vector(const uint32_t* states, int n, trellis::Codebook cb, float* out);

}  // namespace exl3::cpu::detail
