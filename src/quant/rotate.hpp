// Block-diagonal Hadamard-128 rotations of row-major matrices (docs/format.md, Rotations), built on
// trellis::had128_inplace so the quantizer rotates with exactly the transform the decoder inverts.
#pragma once

#include <cstdint>

namespace exl3::quant::detail {

// x <- x . B: every row, in contiguous 128-column chunks. cols % 128 == 0.
void had_right(float* x, int64_t rows, int64_t cols);
void had_right(double* x, int64_t rows, int64_t cols);

// x <- B . x: every column, in contiguous 128-row blocks. rows % 128 == 0.
void had_left(float* x, int64_t rows, int64_t cols);
void had_left(double* x, int64_t rows, int64_t cols);

}  // namespace exl3::quant::detail
