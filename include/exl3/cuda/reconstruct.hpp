// CUDA trellis reconstruction: decodes a whole EXL3 trellis to the rotated-basis weight W_hat
// (fp16, row-major [in, out]) with the same shared codebook/bitstream code the CPU path uses.
//
// Host wrappers never throw across the CUDA boundary: they return the cudaError_t of the launch.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/trellis/codebook.hpp"

namespace exl3::cuda {

// d_trellis: int16 [in/16, out/16, 16K] on the device; d_out: fp16 bits [in, out] on the device.
// in/out must be multiples of 16, K in 1..8. Asynchronous on `stream`.
cudaError_t reconstruct_w_hat(const uint16_t* d_trellis, int64_t in_features, int64_t out_features,
                              int K, trellis::Codebook cb, uint16_t* d_out, cudaStream_t stream);

// Number of CUDA devices, 0 when there is no usable device or driver (never throws).
int device_count();

}  // namespace exl3::cuda
