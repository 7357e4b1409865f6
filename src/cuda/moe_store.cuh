// The output store the grouped MoE kernels (moe_gemv.cuh, moe_gemm.cuh) share.
#pragma once

#include <cstdint>

namespace exl3::cuda::detail {

// One mma C fragment into its group's partial rows (row length out_cols): c[0], c[2] belong to
// slot s0 + i (columns col, col + 8), c[1], c[3] to slot s0 + i + 1, where i is the fragment's
// first slot within the group (8 n + 2 (lane % 4)); slots at or past the group's count are not
// stored.
__device__ __forceinline__ void store_slot_pair(float* out, int64_t out_cols, int s0, int i,
                                                int count, int col, const float (&c)[4]) {
  if (i < count) {
    float* r = out + static_cast<int64_t>(s0 + i) * out_cols;
    r[col] = c[0];
    r[col + 8] = c[2];
  }
  if (i + 1 < count) {
    float* r = out + static_cast<int64_t>(s0 + i + 1) * out_cols;
    r[col] = c[1];
    r[col + 8] = c[3];
  }
}

}  // namespace exl3::cuda::detail
