// Input and output rotations of the EXL3 linear (memory-bound). One warp per 128-element chunk:
// each lane holds 4 consecutive elements, so the 7 butterfly stages are 2 in-register stages
// and 5 xor-shuffle stages, all in fp32.
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/had128.cuh"
#include "cuda/kernels.hpp"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::cuda::detail {
namespace {

constexpr int kWarpsPerBlock = 8;
// |had128(v)| <= sqrt(128) * max|v|; keep the fp16 x' below 2^15.
constexpr float kHadGain = 11.3137085f;
constexpr float kHalfSafe = 32768.0f;

__device__ __forceinline__ float load_act(const void* x, DType t, int64_t idx) {
  switch (t) {
    case DType::kF16:
      return __half2float(static_cast<const __half*>(x)[idx]);
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[idx]);
    default:
      return static_cast<const float*>(x)[idx];
  }
}

// Grid (m, column slices): every block reads its whole row once for the range guard (the row is
// small and L2-resident, and the guard must be the same for every slice), then rotates its own
// slice of kColsPerBlock columns. Many blocks per row keep decode-sized batches fast.
constexpr int kColsPerBlock = kWarpsPerBlock * 128;

__global__ void rotate_input_kernel(const void* __restrict__ x, DType in_type, const uint16_t* __restrict__ suh,
                                    int64_t k, __half* __restrict__ xr, float* __restrict__ row_scale) {
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const __half* su = reinterpret_cast<const __half*>(suh);

  float mx = 0.0f;
  for (int64_t i = threadIdx.x; i < k; i += blockDim.x) {
    mx = fmaxf(mx, fabsf(load_act(x, in_type, row * k + i) * __half2float(su[i])));
  }
  __shared__ float red[kWarpsPerBlock];
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, m));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  float row_max = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarpsPerBlock; ++w) row_max = fmaxf(row_max, red[w]);
  // Power of two, so dividing here and multiplying in the epilogue is exact. NaN/inf inputs
  // keep scale 1 and propagate.
  float scale = 1.0f;
  const float bound = row_max * kHadGain;
  if (bound > kHalfSafe && bound < INFINITY) scale = exp2f(ceilf(log2f(bound / kHalfSafe)));
  if (blockIdx.y == 0 && threadIdx.x == 0) row_scale[row] = scale;
  const float mul = exl3::trellis::kHadScale / scale;

  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * kColsPerBlock + warp * 128;
  if (c0 >= k) return;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t col = c0 + 4 * lane + i;
    v[i] = load_act(x, in_type, row * k + col) * __half2float(su[col]);
  }
  had128_lane4(v, lane);
  __half2 lo = __floats2half2_rn(v[0] * mul, v[1] * mul);
  __half2 hi = __floats2half2_rn(v[2] * mul, v[3] * mul);
  uint2 packed;
  packed.x = *reinterpret_cast<uint32_t*>(&lo);
  packed.y = *reinterpret_cast<uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(xr + row * k + c0 + 4 * lane) = packed;
}

__global__ void rotate_output_kernel(const float* __restrict__ partial, int splits, const float* __restrict__ row_scale,
                                     const uint16_t* __restrict__ svh, const float* __restrict__ bias, int64_t m,
                                     int64_t n, void* __restrict__ y, DType out_type) {
  const int lane = threadIdx.x & 31;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  const int64_t chunks_per_row = n / 128;
  if (chunk >= m * chunks_per_row) return;
  const int64_t row = chunk / chunks_per_row;
  const int64_t col = (chunk % chunks_per_row) * 128 + 4 * lane;
  const int64_t idx = row * n + col;

  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int s = 0; s < splits; ++s) {  // fixed order: deterministic and batch-invariant
    const float4 p = *reinterpret_cast<const float4*>(partial + s * m * n + idx);
    v[0] += p.x;
    v[1] += p.y;
    v[2] += p.z;
    v[3] += p.w;
  }
  had128_lane4(v, lane);
  const float mul = exl3::trellis::kHadScale * row_scale[row];
  const __half* sv = reinterpret_cast<const __half*>(svh);
  float o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = v[i] * mul * __half2float(sv[col + i]) + (bias ? bias[col + i] : 0.0f);

  switch (out_type) {
    case DType::kF16: {
      __half2 a = __floats2half2_rn(o[0], o[1]), b = __floats2half2_rn(o[2], o[3]);
      uint2 pk{*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b)};
      *reinterpret_cast<uint2*>(static_cast<__half*>(y) + idx) = pk;
      break;
    }
    case DType::kBF16: {
      __nv_bfloat162 a = __floats2bfloat162_rn(o[0], o[1]), b = __floats2bfloat162_rn(o[2], o[3]);
      uint2 pk{*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b)};
      *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(y) + idx) = pk;
      break;
    }
    default:
      *reinterpret_cast<float4*>(static_cast<float*>(y) + idx) = make_float4(o[0], o[1], o[2], o[3]);
  }
}

__global__ void finish_output_kernel(const float* __restrict__ src, const float* __restrict__ bias, int64_t total,
                                     int64_t n, void* __restrict__ y, DType out_type) {
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

cudaError_t finish_output(const float* src, const float* bias, int64_t m, int64_t n, void* y, DType out_type,
                          cudaStream_t stream) {
  const int64_t total = m * n;
  const int64_t blocks = (total + 255) / 256;
  if (m <= 0 || n <= 0 || blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  finish_output_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, bias, total, n, y, out_type);
  return cudaGetLastError();
}

cudaError_t rotate_input(const void* x, DType in_type, const uint16_t* suh, int64_t m, int64_t k, __half* xr,
                         float* row_scale, cudaStream_t stream) {
  if (m <= 0 || k % 128 != 0 || m > 0x7FFFFFFF) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(m), static_cast<unsigned>((k + kColsPerBlock - 1) / kColsPerBlock));
  rotate_input_kernel<<<grid, 32 * kWarpsPerBlock, 0, stream>>>(x, in_type, suh, k, xr, row_scale);
  return cudaGetLastError();
}

cudaError_t rotate_output(const float* partial, int splits, const float* row_scale, const uint16_t* svh,
                          const float* bias, int64_t m, int64_t n, void* y, DType out_type, cudaStream_t stream) {
  if (m <= 0 || n % 128 != 0 || splits < 1) return cudaErrorInvalidValue;
  const int64_t chunks = m * (n / 128);
  const int64_t blocks = (chunks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > 0x7FFFFFFF) return cudaErrorInvalidValue;
  rotate_output_kernel<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(
      partial, splits, row_scale, svh, bias, m, n, y, out_type);
  return cudaGetLastError();
}

}  // namespace exl3::cuda::detail
