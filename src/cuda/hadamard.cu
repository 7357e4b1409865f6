// hadamard128_rows (exl3/cuda/hadamard.hpp): one warp per 128-chunk, grid-stride over chunks in
// batches of four, one vector load and one vector store per lane and chunk.
#include "exl3/cuda/hadamard.hpp"

#include <algorithm>

#include "cuda/had128.cuh"
#include "exl3/trellis/hadamard.hpp"

namespace exl3::cuda {
namespace {

constexpr int kWarps = 8;

__global__ void __launch_bounds__(32 * kWarps) hadamard_rows_kernel(const void* __restrict__ x, DType in_type,
                                                                    void* __restrict__ y, DType out_type,
                                                                    int64_t chunks, uint32_t chunks_per_row,
                                                                    const uint16_t* __restrict__ pre,
                                                                    const uint16_t* __restrict__ post) {
  const int lane = threadIdx.x & 31;
  // kBatch chunks per warp per iteration: their loads are all in flight before any butterfly,
  // which a memory-bound kernel with 8-byte lane loads needs to approach the copy bandwidth.
  constexpr int kBatch = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); base < chunks;
       base += stride * kBatch) {
    float v[kBatch][4];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t chunk = base + b * stride;
      if (chunk < chunks) detail::load_act4(x, in_type, chunk * 128 + 4 * lane, v[b]);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t chunk = base + b * stride;
      if (chunk >= chunks) continue;
      const int64_t idx = chunk * 128 + 4 * lane;  // element index; rows are whole chunks
      // 32-bit modulo (the launcher keeps chunk counts below 2^32): a 64-bit one costs more than
      // the butterfly.
      const int64_t col = static_cast<int64_t>(static_cast<uint32_t>(chunk) % chunks_per_row) * 128 + 4 * lane;
      if (pre != nullptr) {
        float s[4];
        detail::load_half4(pre, col, s);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[b][i] *= s[i];
      }
      detail::had128_lane4(v[b], lane);
      float s[4] = {1.0f, 1.0f, 1.0f, 1.0f};
      if (post != nullptr) detail::load_half4(post, col, s);
#pragma unroll
      for (int i = 0; i < 4; ++i) v[b][i] *= exl3::trellis::kHadScale * s[i];
      detail::store_act4(y, out_type, idx, v[b]);
    }
  }
}

}  // namespace

cudaError_t hadamard128_rows(const void* x, DType in_type, void* y, DType out_type, int64_t rows, int64_t cols,
                             const uint16_t* pre, const uint16_t* post, cudaStream_t stream) {
  if (x == nullptr || y == nullptr || rows <= 0 || cols <= 0 || cols % 128 != 0) return cudaErrorInvalidValue;
  const int64_t chunks = rows * (cols / 128);
  if (chunks >= (int64_t{1} << 32)) return cudaErrorInvalidValue;
  int dev = 0, sms = 132;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  // One resident wave (8 blocks of 8 warps per SM), grid-striding beyond that.
  const int64_t blocks = std::min<int64_t>((chunks + kWarps - 1) / kWarps, 8LL * sms);
  hadamard_rows_kernel<<<static_cast<unsigned>(blocks), 32 * kWarps, 0, stream>>>(
      x, in_type, y, out_type, chunks, static_cast<uint32_t>(cols / 128), pre, post);
  return cudaGetLastError();
}

}  // namespace exl3::cuda
