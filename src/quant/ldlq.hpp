// Tile quantization of a regularised weight, with or without LDLQ feedback (docs/format.md, LDLQ).
#pragma once

#include <cstdint>

#include "exl3/quant/encode.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::quant::detail {

// Quantizes w_r [rows, cols] (multiples of 16 and 128). states: [rows/16, cols/16, 256] in
// sequence order; q: [rows, cols] decoded values. With l (strictly block-lower LDL factor of H,
// [rows, rows]) non-null, 16-row blocks go from last to first and block b's target is
// W_r[b] + sum_{j>b} L[j,b]^T (W_r[j] - Q[j]); without it every tile is encoded as is.
void quantize_blocks(const float* w_r, int64_t rows, int64_t cols, const float* l, int K,
                     trellis::Codebook cb, Device device, uint16_t* states, float* q);

// tr(E^T H E) / tr(W^T H W) for E = w - q, all [rows, cols]; h [rows, rows] symmetric.
double proxy_error(const float* w, const float* q, const float* h, int64_t rows, int64_t cols);

}  // namespace exl3::quant::detail
