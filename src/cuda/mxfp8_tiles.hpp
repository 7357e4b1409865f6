// Device layout of an MXFP8 weight for the tensor-core GEMV (mxfp8_gemv.cu): the host permutes
// the checkpoint planes into it once at upload; the kernels and the BF16 dequant read it. One
// source of truth for both sides (EXL3_HD).
//
// The weight [n, k] is cut into tiles of 16 rows x 32 inputs (one UE8M0 block per row). A tile
// is 512 contiguous code bytes, exactly one 16-byte load per lane of a warp, laid out so that a
// lane's load *is* its mma.sync m16n8k16 A fragments for the tile's two k16 steps:
//   lane = 4 g + q holds rows g and g + 8 (bytes 0..7 and 8..15), inputs 8q .. 8q+7 of the block.
//   Step j (0, 1) maps the fragment's k slots {2q, 2q+1, 2q+8, 2q+9} to inputs 8q + 4j + {0..3},
//   so every k16 step stays inside one scale block and B (the activations) is a plain 16-byte
//   load of x[8q .. 8q+7] per lane.
//   Within each 4-byte word the codes are stored in the order {0, 2, 1, 3}: bytes 0 and 2 then
//   form the step's first bf16x2 pair and bytes 1 and 3 the second, decoded with shifts and
//   masks only (mxfp8_decode.cuh).
// Tiles run along k first: tile (t, b) starts at byte (t * kb + b) * 512 (kb = k / 32), so a warp
// walking one row tile's blocks reads contiguous memory. Rows are padded to a multiple of 16 with
// zero codes (and zero-exponent scales), which contribute exact zeros.
// Scales: tile (t, b) has 16 bytes at (t * kb + b) * 16, stored as pairs (row r, row r + 8) at
// bytes 2r, 2r + 1 so a lane reads its two rows' scales in one 16-bit load.
#pragma once

#include <cstdint>

#include "exl3/trellis/hd.hpp"

namespace exl3::cuda::detail {

inline constexpr int kMxfp8TileRows = 16;
inline constexpr int kMxfp8TileBytes = 512;

// Byte offset of code (row, col) in the tiled values plane (kb = k / 32).
EXL3_HD int64_t mxfp8_tile_value_offset(int64_t row, int64_t col, int64_t kb) {
  const int64_t t = row / 16, r = row % 16, b = col / 32, c = col % 32;
  const int64_t g = r % 8, half = r / 8, q = c / 8, w = (c % 8) / 4, i = c % 4;
  // Code order inside a word: {0, 2, 1, 3} (positions of codes 0..3 are 0, 2, 1, 3).
  const int64_t pos = (i == 1) ? 2 : (i == 2) ? 1 : i;
  return (t * kb + b) * kMxfp8TileBytes + (4 * g + q) * 16 + half * 8 + w * 4 + pos;
}

// Byte offset of the scale of (row, block) in the tiled scales plane.
EXL3_HD int64_t mxfp8_tile_scale_offset(int64_t row, int64_t block, int64_t kb) {
  const int64_t t = row / 16, r = row % 16;
  return (t * kb + block) * 16 + 2 * (r % 8) + r / 8;
}

}  // namespace exl3::cuda::detail
