// Helpers shared by the model kernels (model_ops.cu), the decode attention (attention_decode.cu)
// and the routers (router.cu): the paged-KV slot of a position, warp reductions, the "no score"
// value, and the grid size of a launch. (Also the MLA and DSA kernels: mla_attention.cu,
// dsa_indexer.cu.)
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime_api.h>

#include "exl3/cuda/model_ops.hpp"

namespace exl3::cuda::detail {

// Blocks of `per` items that cover n items.
inline unsigned blocks_for(int64_t n, int per) {
  return static_cast<unsigned>((n + per - 1) / per);
}

// f(std::integral_constant<int, HD>{}) for the head dims the GQA attention kernels are built for
// (32 for small test models, 64 and 128, 256 for Gemma 3), cudaErrorInvalidValue for others.
template <typename F>
cudaError_t with_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    case 256:
      return f(std::integral_constant<int, 256>{});
    default:
      return cudaErrorInvalidValue;
  }
}

constexpr float kNegBig = -1e30f;  // "no score yet": finite, so exp(kNegBig - m) is 0, never NaN

__device__ __forceinline__ int64_t kv_slot(const PagedKv& kv, int32_t row, int32_t pos) {
  const int32_t page =
      kv.page_tables[static_cast<int64_t>(row) * kv.max_pages + pos / kv.page_size];
  return static_cast<int64_t>(page) * kv.page_size + pos % kv.page_size;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* scratch /* [32] */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(t);
}

// The output num / den of a softmax state (running max mx, denominator den, numerator num) of
// query head h, with h's sink logit (when `sinks` is set) joining the max and the denominator as
// the CPU engine's attention does: a sink takes weight but weighs no value.
__device__ __forceinline__ float softmax_output(float mx, float den, float num, const float* sinks,
                                                int h) {
  if (sinks != nullptr) {
    const float sink = sinks[h];
    const float mn = fmaxf(mx, sink);
    const float f = expf(mx - mn);
    num *= f;
    den = den * f + expf(sink - mn);
  }
  return num / den;
}

}  // namespace exl3::cuda::detail
