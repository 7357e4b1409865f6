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

}  // namespace exl3::cpu::detail
