// Moving 16x16 tiles between a row-major matrix and the encoder's sequence order.
#pragma once

#include <cstdint>

#include "exl3/trellis/bitstream.hpp"

namespace exl3::quant::detail {

// seq[p] = m[16*ti + perm_row(p), 16*tj + perm_col(p)], scaled by `scale`.
inline void gather_tile(const float* m, int64_t cols, int64_t ti, int64_t tj, float scale,
                        float* seq) {
  const float* base = m + 16 * ti * cols + 16 * tj;
  for (int p = 0; p < trellis::kTileSize; ++p) {
    seq[p] = scale * base[trellis::perm_row(p) * cols + trellis::perm_col(p)];
  }
}

// The inverse of gather_tile (scale 1).
inline void scatter_tile(const float* seq, int64_t cols, int64_t ti, int64_t tj, float* m) {
  float* base = m + 16 * ti * cols + 16 * tj;
  for (int p = 0; p < trellis::kTileSize; ++p)
    base[trellis::perm_row(p) * cols + trellis::perm_col(p)] = seq[p];
}

}  // namespace exl3::quant::detail
