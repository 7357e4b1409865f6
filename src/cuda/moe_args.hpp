// Arguments of the grouped MoE GEMV (src/cuda/moe_gemv.cuh), in a header host code can include.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace exl3::cuda::detail {

// Per-projection view of the uploaded experts.
struct MoeProj {
  const uint32_t* const* trellis = nullptr;  // [E] device pointers to each expert's trellis
  const int8_t* bits = nullptr;              // [E] K of each expert's trellis
  int tiles_n = 0;                           // output features / 16
  int col_offset = 0;                        // first output column in the partial rows
  const __half* x = nullptr;                 // B rows of this projection (see MoeGemvArgs)
};

struct MoeGemvArgs {
  MoeProj proj[2];
  int nproj = 1;
  int col_blocks = 0;  // column blocks per projection (out / 128)
  int k = 0;           // inner dimension
  int splits = 1;
  int num_experts = 0;
  // 0: one grid for every tier, each block switching to its expert's K. 1..8: a homogeneous
  // pass of a kernel built for this K alone; blocks of experts with another K exit at once
  // (mixed layers run one such pass per K present).
  int fixed_k = 0;
  // Groups: decode (group_expert == nullptr): group g = slot g, expert topk_ids[g], one slot.
  const int32_t* topk_ids = nullptr;
  const int32_t* group_expert = nullptr;  // [max_groups]
  const int32_t* group_begin = nullptr;   // first slot
  const int32_t* group_count = nullptr;   // slots in the group (<= 8 * NT)
  const int32_t* num_groups = nullptr;    // device scalar
  // B rows: slot s reads proj.x + row(s) * x_stride, row(s) = (x_row_of_slot ? x_row_of_slot[s]
  // : s) / x_row_div (token rows: route / k; slot rows: div 1).
  int64_t x_stride = 0;
  const int32_t* x_row_of_slot = nullptr;
  int x_row_div = 1;
  // Output: partial[split][slot][col_offset + column], row length out_cols.
  float* partial = nullptr;
  int64_t out_cols = 0;
  int64_t split_stride = 0;  // elements between splits
};

}  // namespace exl3::cuda::detail
