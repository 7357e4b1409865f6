// Row-wise Hadamard-128 on the GPU (docs/format.md, Rotations): every contiguous 128-element chunk
// of each row is multiplied by H128 / sqrt(128) (Sylvester order), with optional per-column
// scales before (`pre`, e.g. suh) and after (`post`, e.g. svh):
//
//   y[r, c] = post[c] * sum_j H[c % 128][j % 128] / sqrt(128) * pre[j] * x[r, j]   (j in c's chunk)
//
// fp16 / bf16 / fp32 in and out independently, fp32 butterfly, memory-bound (one read and one
// write of each element). Asynchronous on `stream`; returns the launch's cudaError_t and never
// synchronises, so it can be captured in a CUDA graph.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/cuda/dtype.hpp"

namespace exl3::cuda {

// x, y: device [rows, cols] row-major (may alias for an in-place transform of equal dtypes);
// cols a positive multiple of 128; pre/post: fp16 bits [cols] on the device, or null for 1.
// cudaErrorInvalidValue for bad shapes.
cudaError_t hadamard128_rows(const void* x, DType in_type, void* y, DType out_type, int64_t rows,
                             int64_t cols, const uint16_t* pre, const uint16_t* post,
                             cudaStream_t stream);

}  // namespace exl3::cuda
