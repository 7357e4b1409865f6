// Internal launchers of the CUDA EXL3 linear (src/cuda). Every launcher returns the launch's
// cudaError_t and never synchronises.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "exl3/cuda/dtype.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::cuda::detail {

// x [m, k] (in_type) * suh, Hadamard-128 per chunk, divided by a per-row power of two that keeps
// |x'| inside fp16 range -> xr [m, k] fp16 and row_scale[m] (the divisor). x is read four
// elements at a time: it must be aligned to four of its elements.
cudaError_t rotate_input(const void* x, DType in_type, const uint16_t* suh, int64_t m, int64_t k,
                         __half* xr, float* row_scale, cudaStream_t stream);
// The same for up to kRotateGroupMax linears reading the same x, in one launch: member i scales by
// suh[i] and writes xr[i], row_scale[i].
constexpr int kRotateGroupMax = 4;
struct RotateGroup {
  const uint16_t* suh[kRotateGroupMax] = {};
  __half* xr[kRotateGroupMax] = {};
  float* row_scale[kRotateGroupMax] = {};
  int count = 0;
};
cudaError_t rotate_input_group(const void* x, DType in_type, const RotateGroup& group, int64_t m,
                               int64_t k, cudaStream_t stream);

// y[m, n] = (had128(sum_s partial[s, m, n]) * row_scale[m]) * svh + bias, stored as out_type.
cudaError_t rotate_output(const float* partial, int splits, const float* row_scale,
                          const uint16_t* svh, const float* bias, int64_t m, int64_t n, void* y,
                          DType out_type, cudaStream_t stream);

// out [k, n] (fp16, or bf16 when `bf16`) = diag(suh) . B . W_hat . B . diag(svh): the
// original-basis weight for the cuBLAS path. reconstruct_folded_prepare sets the kernel attributes
// (call once, outside graph capture).
cudaError_t reconstruct_folded_prepare(int K, trellis::Codebook cb);
cudaError_t reconstruct_folded(const uint16_t* trellis, int K, trellis::Codebook cb, int64_t k,
                               int64_t n, const uint16_t* suh, const uint16_t* svh, bool bf16,
                               void* out, cudaStream_t stream);

// y[m, n] (out_type) = src[m, n] + bias[n] (src fp32), or y += bias when src is null; bias may
// be null.
cudaError_t finish_output(const float* src, const float* bias, int64_t m, int64_t n, void* y,
                          DType out_type, cudaStream_t stream);

// partial[s, m, n] = xr[m, k_s] @ W_hat[k_s, n] for each of `splits` k ranges (tensor cores).
cudaError_t mma_gemm(const uint16_t* trellis, int K, trellis::Codebook cb, const __half* xr,
                     int64_t m, int64_t k, int64_t n, int splits, float* partial,
                     cudaStream_t stream);

// Per-K entry points (one translation unit each, so the 8 bit widths compile in parallel),
// instantiated in files generated from src/cuda/mma_gemm_k.cu.in; mma_gemm and gemv pick one
// through trellis::with_bits.
template <int K>
cudaError_t mma_gemm_k(const uint16_t* trellis, trellis::Codebook cb, const __half* xr, int64_t m,
                       int64_t k, int64_t n, int splits, float* partial, cudaStream_t stream);

template <int K>
int mma_blocks_per_sm_k(trellis::Codebook cb);
int mma_blocks_per_sm(int K, trellis::Codebook cb);

// The swap-AB GEMV for decode-sized m with the output epilogue fused (src/cuda/gemv.cuh), for
// up to kGemvGroupMax linears of the same K, codebook and input width that read the same rows
// (each from its own rotated copy xr): partial[s, m, n] per split, then y = the rotate_output
// epilogue. `counters` ([token groups][n / 128] int32, zero; one token group for m <= 16, one per
// 32 rows beyond) are left zero.
constexpr int kGemvGroupMax = kRotateGroupMax;
struct GemvMember {
  const uint32_t* trellis = nullptr;
  const __half* xr = nullptr;        // [m, k] rotated input (unused when the group stages)
  const uint16_t* suh = nullptr;     // [k] input signs (read when the group stages)
  const float* row_scale = nullptr;  // [m]
  float* partial = nullptr;          // [splits, m, n]
  const uint16_t* svh = nullptr;     // [n]
  const float* bias = nullptr;       // [n] or null
  void* y = nullptr;                 // [m, n] out_type
  int32_t* counters = nullptr;
  int n = 0;
  int splits = 1;
  int block_begin = 0;  // first grid x block of this member (sum of the previous n / 128)
};
// staged_chunks > 0 (m <= 8): the kernel rotates x itself, as rotate_input would (the same
// bits), into shared memory: each block the chunks its slice touches (at most staged_chunks per
// row), so no xr / row_scale is read. LinearPlan::staged_chunks says when.
struct GemvGroupArgs {
  GemvMember member[kGemvGroupMax];
  int count = 0;
  int m = 0;
  int k = 0;
  DType out_type = DType::kF32;
  const void* x = nullptr;  // [m, k] in_type, when staged
  DType in_type = DType::kF32;
  int staged_chunks = 0;
};
cudaError_t gemv(int K, trellis::Codebook cb, const GemvGroupArgs& args, cudaStream_t stream);
template <int K>
cudaError_t gemv_k(trellis::Codebook cb, const GemvGroupArgs& args, cudaStream_t stream);
template <int K>
int gemv_blocks_per_sm_k(trellis::Codebook cb);
int gemv_blocks_per_sm(int K, trellis::Codebook cb);

}  // namespace exl3::cuda::detail
