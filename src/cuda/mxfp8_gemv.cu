// MXFP8 GEMV for decode batches (m <= 16), the split-K reduction and the BF16 dequant pass.
//
// Shape assumptions: k % 32 == 0 (so every 16-byte weight load is aligned and lies inside one
// 32-wide scale block), x rows 16-byte aligned (k % 8 == 0 follows), m <= 16.
// Work split: a warp owns 4 consecutive output rows; a lane takes 16 consecutive inputs (half a
// scale block) per step and walks its split's K range with stride 32 lanes * 16. Per step it
// loads 4 x 16 codes + 4 scales once and reuses them for every activation row. Sums per lane in
// a fixed order, a fixed butterfly across the warp, and a fixed split order in the reduction:
// a row's result depends on (k, n, splits) only, never on m or the other rows.
#include <cuda_bf16.h>

#include "cuda/mxfp8_decode.cuh"
#include "cuda/mxfp8_kernels.hpp"

namespace exl3::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
static_assert(kWarps * kRowsPerWarp == kMxfp8GemvRowsPerBlock);

__device__ __forceinline__ void store_out(void* y, DType t, int64_t idx, float v) {
  if (t == DType::kF32) {
    static_cast<float*>(y)[idx] = v;
  } else {
    static_cast<__nv_bfloat16*>(y)[idx] = __float2bfloat16_rn(v);
  }
}

template <int M>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const uint8_t* __restrict__ values,
                                                           const uint8_t* __restrict__ scales,
                                                           const __nv_bfloat16* __restrict__ x, int m, int64_t k,
                                                           int64_t n, int splits, float* __restrict__ partial,
                                                           const float* __restrict__ bias, void* y, DType out_type) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  if (row0 >= n) return;  // warp-uniform
  const int64_t halves = k / 16;
  const int split = blockIdx.y;
  const int64_t h_begin = halves * split / splits, h_end = halves * (split + 1) / splits;
  const int64_t kb = k / 32;

  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int i = 0; i < M; ++i) acc[r][i] = 0.0f;

  for (int64_t h = h_begin + lane; h < h_end; h += 32) {
    float w[kRowsPerWarp][16];
    float s[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = row0 + r;
      if (row < n) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(values + row * k + h * 16));
        decode4(v.x, w[r]);
        decode4(v.y, w[r] + 4);
        decode4(v.z, w[r] + 8);
        decode4(v.w, w[r] + 12);
        s[r] = mxfp8::ue8m0_to_float_x256(__ldg(scales + row * kb + h / 2));
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) w[r][j] = 0.0f;
        s[r] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i < m) {
        const uint4* xp = reinterpret_cast<const uint4*>(x + i * k + h * 16);
        float xv[16];
        bf16x8_to_float(__ldg(xp), xv);
        bf16x8_to_float(__ldg(xp + 1), xv + 8);
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          float p = 0.0f;
#pragma unroll
          for (int j = 0; j < 16; ++j) p = fmaf(xv[j], w[r][j], p);
          acc[r][i] = fmaf(p, s[r], acc[r][i]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      if (i < m) {
        float v = acc[r][i];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        const int64_t row = row0 + r;
        if (lane == 0 && row < n) {
          if (splits == 1) {
            store_out(y, out_type, i * n + row, v + (bias != nullptr ? bias[row] : 0.0f));
          } else {
            partial[(static_cast<int64_t>(split) * m + i) * n + row] = v;
          }
        }
      }
    }
  }
}

__global__ void reduce_kernel(const float* __restrict__ partial, int splits, const float* __restrict__ bias,
                              int64_t m, int64_t n, void* y, DType out_type) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= m * n) return;
  float v = 0.0f;
  for (int s = 0; s < splits; ++s) v += partial[s * m * n + idx];
  if (bias != nullptr) v += bias[idx % n];
  store_out(y, out_type, idx, v);
}

// One thread per 16 codes (half a scale block).
__global__ void dequant_kernel(const uint8_t* __restrict__ values, const uint8_t* __restrict__ scales, int64_t k,
                               int64_t n, __nv_bfloat16* __restrict__ out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * k / 16) return;
  const int64_t row = idx / (k / 16), h = idx % (k / 16);
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(values + row * k + h * 16));
  const float s = mxfp8::ue8m0_to_float_x256(scales[row * (k / 32) + h / 2]);
  float w[16];
  decode4(v.x, w);
  decode4(v.y, w + 4);
  decode4(v.z, w + 8);
  decode4(v.w, w + 12);
  __align__(16) __nv_bfloat162 o[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = __floats2bfloat162_rn(w[2 * j] * s, w[2 * j + 1] * s);
  uint4* dst = reinterpret_cast<uint4*>(out + row * k + h * 16);
  dst[0] = *reinterpret_cast<const uint4*>(&o[0]);
  dst[1] = *reinterpret_cast<const uint4*>(&o[4]);
}

template <int M>
cudaError_t launch_gemv(const uint8_t* values, const uint8_t* scales, const void* x, int64_t m, int64_t k, int64_t n,
                        int splits, float* partial, const float* bias, void* y, DType out_type, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((n + kMxfp8GemvRowsPerBlock - 1) / kMxfp8GemvRowsPerBlock),
                  static_cast<unsigned>(splits));
  gemv_kernel<M><<<grid, kWarps * 32, 0, stream>>>(values, scales, static_cast<const __nv_bfloat16*>(x),
                                                   static_cast<int>(m), k, n, splits, partial, bias, y, out_type);
  return cudaGetLastError();
}

}  // namespace

cudaError_t mxfp8_gemv(const uint8_t* values, const uint8_t* scales, const void* x, int64_t m, int64_t k, int64_t n,
                       int splits, float* partial, const float* bias, void* y, DType out_type, cudaStream_t stream) {
  if (m <= 0 || m > 16 || k % 32 != 0 || splits < 1 || (out_type != DType::kF32 && out_type != DType::kBF16)) {
    return cudaErrorInvalidValue;
  }
  if (m == 1) return launch_gemv<1>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
  if (m == 2) return launch_gemv<2>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
  if (m <= 4) return launch_gemv<4>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
  if (m <= 8) return launch_gemv<8>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
  return launch_gemv<16>(values, scales, x, m, k, n, splits, partial, bias, y, out_type, stream);
}

cudaError_t mxfp8_reduce(const float* partial, int splits, const float* bias, int64_t m, int64_t n, void* y,
                         DType out_type, cudaStream_t stream) {
  if (out_type != DType::kF32 && out_type != DType::kBF16) return cudaErrorInvalidValue;
  const int64_t total = m * n;
  reduce_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(partial, splits, bias, m, n, y,
                                                                                out_type);
  return cudaGetLastError();
}

cudaError_t mxfp8_dequant_bf16(const uint8_t* values, const uint8_t* scales, int64_t k, int64_t n, uint16_t* out,
                               cudaStream_t stream) {
  if (k % 32 != 0) return cudaErrorInvalidValue;
  const int64_t total = n * k / 16;
  dequant_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
      values, scales, k, n, reinterpret_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

}  // namespace exl3::cuda::detail
