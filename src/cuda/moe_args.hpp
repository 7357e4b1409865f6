// Arguments of the grouped MoE GEMV (src/cuda/moe_gemv.cuh), in a header host code can include.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace exl3::cuda::detail {

// Route slots: a route r = t * k + j sits in slot slot_of_route[r] (decode plan: the identity,
// tables null); route_of_slot is the inverse.
struct MoeSlots {
  const int32_t* slot_of_route = nullptr;
  const int32_t* route_of_slot = nullptr;
};

// The activation's operands (moe_epilogue.cuh): FC1 split partials [splits][slots_cap][2I] (gate
// | up) and the input rotation's row scales in; fp16 activation rows and their scales out.
struct MoeActivateArgs {
  const float* partial = nullptr;
  int splits = 1;
  int64_t slots_cap = 0;
  int k = 1;
  int64_t I = 0;
  bool shared_h = false;
  const int32_t* ids = nullptr;
  int num_experts = 0;
  MoeSlots slots;
  const float* scale_g = nullptr;
  const float* scale_u = nullptr;
  const uint16_t* intermediate = nullptr;  // [E][3][I] fp16: gate svh | up svh | down suh
  __half* act = nullptr;
  float* act_scale = nullptr;
};

// The combine's operands: FC2 split partials [splits][slots_cap][H] in, FP32 token rows out.
struct MoeCombineArgs {
  const float* partial = nullptr;
  int splits = 1;
  int64_t slots_cap = 0;
  int k = 1;
  int64_t H = 0;
  bool shared_h = false;
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int num_experts = 0;
  MoeSlots slots;
  const float* act_scale = nullptr;
  const uint16_t* down_svh = nullptr;
  float* out = nullptr;
};

// What a decode-plan GEMV block does after storing its partials, once it is the last block of
// its unit to finish (a self-resetting counter per unit): FC1 activates its slot, FC2 combines
// its token's 128-column chunk. So a decode MoE layer has no separate activation or combine launch.
enum class MoeEpilogue : int8_t { kNone, kActivate, kCombine };

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
  // Decode plan only (groups of one slot). counters: kActivate one per slot, kCombine one per
  // (token, 128-column chunk); zero before the first launch, and left zero by every launch.
  MoeEpilogue epilogue = MoeEpilogue::kNone;
  int32_t* counters = nullptr;
  MoeActivateArgs activate;
  MoeCombineArgs combine;
};

}  // namespace exl3::cuda::detail
