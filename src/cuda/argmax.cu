// argmax_rows (exl3/cuda/argmax.hpp). A row is cut into chunks of kChunk columns, one block each,
// so a batch-1 row of a 150k vocabulary spreads over ~40 SMs instead of one. Each block reduces
// its chunk to one packed key and merges it with a 64-bit atomicMax: the packing orders by value
// first and by lower id second, so the merge order of the blocks cannot change the result.
#include "cuda/pdl.cuh"
#include "exl3/cuda/argmax.hpp"

#include <cmath>

namespace exl3::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 16;
constexpr int kChunk = kThreads * kPerThread;

// Monotone map of a float to uint32 (larger value -> larger key), with -0 as +0 and NaN as -inf
// (the scan's `>` never picks a NaN). Every real value maps above 0, the memset's empty key.
__device__ __forceinline__ uint32_t ordered(float v) {
  if (isnan(v)) v = -INFINITY;
  if (v == 0.0f) v = 0.0f;
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ uint64_t pack(uint32_t key, int32_t id) {
  return (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}

__global__ void __launch_bounds__(kThreads)
    argmax_kernel(const float* __restrict__ logits, const __grid_constant__ ArgmaxLayout layout,
                  uint64_t* __restrict__ keys) {
  pdl_begin();
  const int64_t row = blockIdx.z;
  const int part = static_cast<int>(blockIdx.y);
  const int32_t count = layout.count[part];
  const int32_t chunk0 = static_cast<int32_t>(blockIdx.x) * kChunk;
  if (chunk0 >= count) return;
  const float* src = logits + part * layout.part_stride + row * layout.row_stride;
  const int32_t begin = layout.begin[part];
  uint64_t best = 0;
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int32_t c = chunk0 + i * kThreads + static_cast<int32_t>(threadIdx.x);
    if (c < count) {
      const uint64_t k = pack(ordered(src[c]), begin + c);
      best = k > best ? k : best;
    }
  }
  // The scan starts at id 0 and nothing is larger than a NaN there: id 0 wins outright.
  if (begin == 0 && chunk0 == 0 && threadIdx.x == 0 && isnan(src[0])) best = ~uint64_t{0};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xFFFFFFFFu, best, o);
    best = other > best ? other : best;
  }
  __shared__ uint64_t warp_best[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
    atomicMax(reinterpret_cast<unsigned long long*>(keys + row),
              static_cast<unsigned long long>(best));
  }
}

}  // namespace

cudaError_t argmax_rows(const float* logits, const ArgmaxLayout& layout, int64_t rows,
                        uint64_t* keys, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (layout.parts < 1 || layout.parts > kArgmaxMaxParts) return cudaErrorInvalidValue;
  int32_t widest = 0;
  for (int p = 0; p < layout.parts; ++p) {
    if (layout.count[p] <= 0) return cudaErrorInvalidValue;
    widest = layout.count[p] > widest ? layout.count[p] : widest;
  }
  if (const cudaError_t e = cudaMemsetAsync(keys, 0, static_cast<size_t>(rows) * 8, stream);
      e != cudaSuccess)
    return e;
  constexpr int64_t kMaxGridRows = 65535;  // grid.z
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxGridRows) {
    const int64_t n = rows - r0 < kMaxGridRows ? rows - r0 : kMaxGridRows;
    const dim3 grid(static_cast<unsigned>((widest + kChunk - 1) / kChunk),
                    static_cast<unsigned>(layout.parts), static_cast<unsigned>(n));
    launch_pdl(argmax_kernel, grid, kThreads, 0, stream, logits + r0 * layout.row_stride, layout,
               keys + r0);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace exl3::cuda
