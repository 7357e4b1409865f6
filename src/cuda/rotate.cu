// Input and output rotations of the EXL3 linear (memory-bound). One warp per 128-element chunk:
// each lane holds 4 consecutive elements, so the 7 butterfly stages are 2 in-register stages
// and 5 xor-shuffle stages, all in fp32.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/had128.cuh"
#include "cuda/kernels.hpp"
#include "cuda/pdl.cuh"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::cuda::detail {
namespace {

constexpr int kWarpsPerBlock = 8;

// Grid (m, column slices): every block reads its whole row once for the range guard (the row is
// small and L2-resident, and the guard must be the same for every slice), then rotates its own
// slice of kColsPerBlock columns. Many blocks per row keep decode-sized batches fast.
constexpr int kColsPerBlock = kWarpsPerBlock * 128;

// Grid z: the group member (its own suh, xr and row_scale).
__global__ void rotate_input_kernel(const void* __restrict__ x, DType in_type,
                                    const __grid_constant__ RotateGroup g, int64_t k) {
  pdl_begin();
  const uint16_t* __restrict__ suh = g.suh[blockIdx.z];
  __half* __restrict__ xr = g.xr[blockIdx.z];
  float* __restrict__ row_scale = g.row_scale[blockIdx.z];
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Four columns per thread and step (vector loads), unrolled so a decode row's loads are all in
  // flight together.
  float mx = 0.0f;
#pragma unroll 4
  for (int64_t i = 4 * threadIdx.x; i < k; i += 4 * blockDim.x)
    mx = guard_max4(x, in_type, row * k + i, suh, i, mx);
  __shared__ float red[kWarpsPerBlock];
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, m));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  float row_max = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarpsPerBlock; ++w) row_max = fmaxf(row_max, red[w]);
  // Power of two, so dividing here and multiplying in the epilogue is exact.
  const float scale = guard_divisor(row_max * kHadGain);
  if (blockIdx.y == 0 && threadIdx.x == 0) row_scale[row] = scale;
  const float mul = exl3::trellis::kHadScale / scale;

  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kColsPerBlock + warp * 128;
  if (c0 >= k) return;
  *reinterpret_cast<uint2*>(xr + row * k + c0 + 4 * lane) =
      rotate_chunk_lane4(x, in_type, row * k + c0 + 4 * lane, suh, c0 + 4 * lane, mul, lane);
}

__global__ void rotate_output_kernel(const float* __restrict__ partial, int splits,
                                     const float* __restrict__ row_scale,
                                     const uint16_t* __restrict__ svh,
                                     const float* __restrict__ bias, int64_t m, int64_t n,
                                     void* __restrict__ y, DType out_type) {
  pdl_begin();
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t chunks_per_row = n / 128;
  if (chunk >= m * chunks_per_row) return;
  const int64_t row = chunk / chunks_per_row;
  finish_output_chunk(partial, splits, m, n, row, (chunk % chunks_per_row) * 128, row_scale[row],
                      svh, bias, y, out_type, threadIdx.x & 31);
}

__global__ void finish_output_kernel(const float* __restrict__ src, const float* __restrict__ bias,
                                     int64_t total, int64_t n, void* __restrict__ y,
                                     DType out_type) {
  pdl_begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const float b = bias != nullptr ? bias[i % n] : 0.0f;
  switch (out_type) {
    case DType::kF16: {
      __half* p = static_cast<__half*>(y) + i;
      *p = __float2half_rn((src != nullptr ? src[i] : __half2float(*p)) + b);
      break;
    }
    case DType::kBF16: {
      __nv_bfloat16* p = static_cast<__nv_bfloat16*>(y) + i;
      *p = __float2bfloat16_rn((src != nullptr ? src[i] : __bfloat162float(*p)) + b);
      break;
    }
    default:
      static_cast<float*>(y)[i] = (src != nullptr ? src[i] : static_cast<float*>(y)[i]) + b;
  }
}

}  // namespace

cudaError_t finish_output(const float* src, const float* bias, int64_t m, int64_t n, void* y,
                          DType out_type, cudaStream_t stream) {
  const int64_t total = m * n;
  const int64_t blocks = (total + 255) / 256;
  if (m <= 0 || n <= 0 || blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  launch_pdl(finish_output_kernel, static_cast<unsigned>(blocks), 256, 0, stream, src, bias, total,
             n, y, out_type);
  return cudaGetLastError();
}

cudaError_t rotate_input_group(const void* x, DType in_type, const RotateGroup& group, int64_t m,
                               int64_t k, cudaStream_t stream) {
  if (m <= 0 || k % 128 != 0 || m > 0x7FFFFFFF || group.count < 1 || group.count > kRotateGroupMax)
    return cudaErrorInvalidValue;
  // Four-element vector loads: x aligned to four of its elements.
  if (reinterpret_cast<uintptr_t>(x) % (4 * (in_type == DType::kF32 ? 4 : 2)) != 0)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(m),
                  static_cast<unsigned>((k + kColsPerBlock - 1) / kColsPerBlock),
                  static_cast<unsigned>(group.count));
  launch_pdl(rotate_input_kernel, grid, 32 * kWarpsPerBlock, 0, stream, x, in_type, group, k);
  return cudaGetLastError();
}

cudaError_t rotate_input(const void* x, DType in_type, const uint16_t* suh, int64_t m, int64_t k,
                         __half* xr, float* row_scale, cudaStream_t stream) {
  RotateGroup g;
  g.suh[0] = suh;
  g.xr[0] = xr;
  g.row_scale[0] = row_scale;
  g.count = 1;
  return rotate_input_group(x, in_type, g, m, k, stream);
}

cudaError_t rotate_output(const float* partial, int splits, const float* row_scale,
                          const uint16_t* svh, const float* bias, int64_t m, int64_t n, void* y,
                          DType out_type, cudaStream_t stream) {
  if (m <= 0 || n % 128 != 0 || splits < 1) return cudaErrorInvalidValue;
  const int64_t chunks = m * (n / 128);
  const int64_t blocks = (chunks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  launch_pdl(rotate_output_kernel, static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream,
             partial, splits, row_scale, svh, bias, m, n, y, out_type);
  return cudaGetLastError();
}

}  // namespace exl3::cuda::detail
