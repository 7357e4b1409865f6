// Internal entry points of the decode attention kernels (src/cuda/attention_decode*.cu), for
// attention_decode (include/exl3/cuda/model_ops.hpp). nvcc translation units only.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "exl3/cuda/model_ops.hpp"

namespace exl3::cuda::detail {

// Splits per (token, head block) at most: the split plan of both decode kernels (a split's state
// merge in shared memory is sized for it).
constexpr int kDecodeMaxSplits = 32;

// Keys per split of the tensor-core kernel: a token's `keys` cut into `splits` ranges of equal
// length, rounded up to whole 64-key chunks (the block's staging unit).
__host__ __device__ inline int decode_mma_split_keys(int keys, int splits) {
  const int per = (keys + splits - 1) / splits;
  const int chunk = (per + 63) / 64 * 64;
  return chunk > 64 ? chunk : 64;
}

// Blocks per token of the tensor-core kernel (up to 16 query heads of one kv head each), and the
// softmax-state rows of a token's split in its workspace.
int decode_mma_row_blocks(const AttnShape& s);
int64_t decode_mma_state_rows(const AttnShape& s);

// The fp16 cache's decode attention on tensor cores (src/cuda/attention_decode_mma.cu), with
// attention_decode's arguments; splits > 1 needs counters (zero at rest, at least
// count * decode_mma_row_blocks) and partial (count * splits * decode_mma_state_rows *
// (head_dim + 2) floats).
cudaError_t attention_decode_mma(const float* q, const int32_t* tokens, int64_t count,
                                 TokenMeta meta, const AttnShape& s, float scale, const PagedKv& kv,
                                 int splits, int32_t* counters, float* partial, float* out,
                                 cudaStream_t stream);

}  // namespace exl3::cuda::detail
