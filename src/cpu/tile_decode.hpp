// Internal: tile decode in sequence order (the order the trellis stores positions in), and the
// individual paths behind it, exposed so tests can check each one against the shared header.
#pragma once

#include <cstdint>

#include "exl3/trellis/codebook.hpp"

namespace exl3::cpu {

// vals[p] = decoded value of sequence position p (no tensor-core un-permutation), fastest path.
void decode_tile_seq(const uint16_t* tile, int K, trellis::Codebook cb, float* vals);

namespace detail {

// Portable path.
void decode_seq_scalar(const uint16_t* tile, int K, trellis::Codebook cb, float* vals);

// AVX2/F16C path; returns false (and writes nothing) when the CPU lacks it.
bool decode_seq_vector(const uint16_t* tile, int K, trellis::Codebook cb, float* vals);

// The AVX2/F16C codebook decode of n (multiple of 8) 16-bit states; false when unavailable.
bool decode_states_vector(const uint32_t* states, int n, trellis::Codebook cb, float* out);

}  // namespace detail
}  // namespace exl3::cpu
