// Internal launchers of the CUDA MXFP8 linear (mxfp8_gemv.cu). Each returns the launch's
// cudaError_t and never synchronises. Weights are in the tiled layout of mxfp8_tiles.hpp
// (values and scales as the host permuted them); k % 32 == 0; x [m, k] BF16, rows 16-byte
// aligned; `partial` is fp32 [splits, m, n].
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/cuda/dtype.hpp"

namespace exl3::cuda::detail {

// Largest m the tensor-core GEMV takes (8 activation rows per n8 tile, up to 8 tiles).
inline constexpr int64_t kMxfp8GemvMaxM = 64;

// splits == 1 writes y (out_type, + bias) directly, else fp32 partials over whole 32-input
// blocks (1 <= splits <= k / 32).
cudaError_t mxfp8_gemv(const uint8_t* values, const uint8_t* scales, const void* x, int64_t m,
                       int64_t k, int64_t n, int splits, float* partial, const float* bias, void* y,
                       DType out_type, cudaStream_t stream);

// y[m, n] = sum_s partial[s, m, n] (s ascending) + bias[n] as out_type.
cudaError_t mxfp8_reduce(const float* partial, int splits, const float* bias, int64_t m, int64_t n,
                         void* y, DType out_type, cudaStream_t stream);

// out [n, k] BF16 (row-major) = dq(W).
cudaError_t mxfp8_dequant_bf16(const uint8_t* values, const uint8_t* scales, int64_t k, int64_t n,
                               uint16_t* out, cudaStream_t stream);

}  // namespace exl3::cuda::detail
