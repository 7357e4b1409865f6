// Internal launchers of the CUDA MXFP8 linear (mxfp8_gemv.cu, mxfp8_gemm.cu). Each returns the
// launch's cudaError_t and never synchronises. Shapes: k % 32 == 0, values [n, k], scales
// [n, k / 32], x [m, k] BF16; `partial` is fp32 [splits, m, n].
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/cuda/linear.hpp"

namespace exl3::cuda::detail {

// The GEMV for m <= 16: splits == 1 writes y (out_type, + bias) directly, else fp32 partials.
cudaError_t mxfp8_gemv(const uint8_t* values, const uint8_t* scales, const void* x, int64_t m, int64_t k,
                       int64_t n, int splits, float* partial, const float* bias, void* y, DType out_type,
                       cudaStream_t stream);
// Threads blocks of the GEMV cover this many output rows (for split-K planning).
inline constexpr int kMxfp8GemvRowsPerBlock = 32;

// The tensor-core GEMM: partials like the GEMV (splits over whole 32-wide K blocks); splits == 1
// writes y directly.
cudaError_t mxfp8_mma(const uint8_t* values, const uint8_t* scales, const void* x, int64_t m, int64_t k, int64_t n,
                      int splits, float* partial, const float* bias, void* y, DType out_type, cudaStream_t stream);
inline constexpr int kMxfp8MmaTileN = 64;

// y[m, n] = sum_s partial[s, m, n] (s ascending) + bias[n] as out_type.
cudaError_t mxfp8_reduce(const float* partial, int splits, const float* bias, int64_t m, int64_t n, void* y,
                         DType out_type, cudaStream_t stream);

// out [n, k] BF16 = dq(W).
cudaError_t mxfp8_dequant_bf16(const uint8_t* values, const uint8_t* scales, int64_t k, int64_t n, uint16_t* out,
                               cudaStream_t stream);

}  // namespace exl3::cuda::detail
