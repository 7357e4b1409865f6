// Whole-tile and whole-tensor decode built from the codebook and bitstream primitives.
//
// A trellis tensor is int16 [in/16, out/16, 16*K]; tile (i, j) covers rows 16i.. (input channels)
// and columns 16j.. (output channels) of the rotated-basis weight W_hat [in, out]. Tiles are
// row-major with i major, each tile's 16*K words contiguous.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/codebook.hpp"
#include "exl3/trellis/hd.hpp"

namespace exl3::trellis {

// Decode one tile to fp16 bits in row-major 16x16 order (out[16*r + c], r = input offset).
EXL3_HD void decode_tile_bits(const uint16_t* tile, int K, Codebook cb, uint16_t* out) {
  for (int p = 0; p < kTileSize; ++p) out[perm_index(p)] = decode_bits(unpack_state(tile, K, p), cb);
}

// Pointer to tile (i, j) of a trellis with `tiles_n` = out_features/16 tile columns.
EXL3_HD const uint16_t* tile_ptr(const uint16_t* trellis, int K, int64_t tiles_n, int64_t i,
                                 int64_t j) {
  return trellis + (i * tiles_n + j) * static_cast<int64_t>(tile_words16(K));
}

// Legacy packed signs (su / sv, int16 [n/16]): bit i of word j is channel 16j+i; 1 means -1.
// Returns fp16 bits of +1.0 (0x3C00) or -1.0 (0xBC00).
EXL3_HD uint16_t legacy_sign_bits(const uint16_t* packed, int64_t channel) {
  return ((packed[channel >> 4] >> (channel & 15)) & 1u) ? 0xBC00u : 0x3C00u;
}

}  // namespace exl3::trellis
