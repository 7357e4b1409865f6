// Internal launchers of the fused CUDA MoE (src/cuda/moe*.cu). Every launcher returns the
// launch's cudaError_t and never synchronises; all sizes are plan capacities, and live counts
// come from device memory, so a captured graph replays for any m up to the plan's capacity.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "cuda/moe_args.hpp"
#include "exl3/cuda/dtype.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::cuda::detail {

// Route slots: a route r = t * k + j sits in slot slot_of_route[r] (decode plan: the identity,
// tables null); route_of_slot is the inverse.
struct MoeSlots {
  const int32_t* slot_of_route = nullptr;
  const int32_t* route_of_slot = nullptr;
};

// Route packing for the prefill plan (counts must be zeroed first; cudaMemsetAsync):
//   counts[e]       routes per expert
//   groups          per expert, ceil(count / group_size) groups of consecutive slots
//   slots           expert-major, in any order inside an expert (results do not depend on it:
//                   every slot's arithmetic is independent of the others)
cudaError_t moe_pack_routes(const int32_t* topk_ids, int64_t routes, int num_experts,
                            int group_size, int32_t* counts, int32_t* fill, int32_t* offsets,
                            int32_t* group_expert, int32_t* group_begin, int32_t* group_count,
                            int32_t* num_groups, int32_t* slot_of_route, int32_t* route_of_slot,
                            cudaStream_t stream);

// Input rotation of the gate and up projections: rows of x * suh, Hadamard-128 per chunk,
// divided by a per-row power of two that keeps fp16 in range -> xg/xu [rows, H] fp16 and
// scale_g/scale_u [rows]. shared_h: rows are tokens and suh row 0 serves all experts;
// otherwise rows are slots and each uses its expert's suh row.
cudaError_t moe_rotate_input(const void* x, DType in_type, int64_t m, int k, int64_t H,
                             bool shared_h, const int32_t* topk_ids, int num_experts,
                             MoeSlots slots, const uint16_t* gate_suh, const uint16_t* up_suh,
                             __half* xg, __half* xu, float* scale_g, float* scale_u,
                             cudaStream_t stream);

// The expert activation beyond the plain SwiGLU (gpt-oss): biases on gate / up, the clamped
// SwiGLU, and padded channels. Defaults are the plain SiLU(gate) * up.
struct MoeActivation {
  const float* gate_bias = nullptr;  // [E, I] fp32 (zeros past the real channels), or null
  const float* up_bias = nullptr;
  // limit > 0: a = min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + 1)
  float alpha = 0.0f, limit = 0.0f;
  int64_t valid = INT64_MAX;  // channels >= valid pad a padded expert linear: a = 0 there
};

// Activation per slot: sum the FC1 split partials ([splits][slots][2I], gate | up), rotate each
// 128-chunk, apply gate/up svh and the input scales (and the biases), a = SiLU(gate) * up (or
// `fn`'s form) * down_suh, rotate, and store fp16 with a per-slot power-of-two guard -> act
// [slots, I], act_scale [slots].
cudaError_t moe_activate(const float* partial, int splits, int64_t slots_cap, int64_t routes, int k,
                         int64_t I, bool shared_h, const int32_t* topk_ids, int num_experts,
                         MoeSlots slots, const float* scale_g, const float* scale_u,
                         const uint16_t* intermediate, const MoeActivation& fn, __half* act,
                         float* act_scale, cudaStream_t stream);

// Output per token: out[t] = sum_j w[t, j] * (H128(sum of FC2 splits of its slot) * act_scale
// * down_svh[e] + down_bias[e]) in FP32, in route order j = 0..k-1. shared_h: the rotation and
// svh are linear and shared, so they run once after the weighted sum (no bias there).
// down_bias: [E, H] fp32 or null.
cudaError_t moe_combine(const float* partial, int splits, int64_t slots_cap, int64_t m, int k,
                        int64_t H, bool shared_h, const int32_t* topk_ids,
                        const float* topk_weights, int num_experts, MoeSlots slots,
                        const float* act_scale, const uint16_t* down_svh, const float* down_bias,
                        float* out, cudaStream_t stream);

// The decode-once grouped GEMM (moe_gemm.cuh): the grouped GEMV's arguments, groups of up to
// kMoeGemmSlots (128) slots.
cudaError_t moe_gemm(trellis::Codebook cb, const MoeGemvArgs& a, int max_groups,
                     cudaStream_t stream);
template <trellis::Codebook CB>
cudaError_t launch_moe_gemm_cb(const MoeGemvArgs& a, int max_groups, cudaStream_t stream);

// The grouped GEMV (moe_gemv.cuh); nt = 1 (groups of one slot) or 4 (groups of up to 32).
// max_groups is the grid's group extent; blocks past the live group count exit.
cudaError_t moe_gemv(trellis::Codebook cb, const MoeGemvArgs& a, int nt, int max_groups,
                     cudaStream_t stream);
// One instance per codebook, in files generated from src/cuda/moe_gemv_cb.cu.in; moe_gemv picks
// one through trellis::with_codebook.
template <trellis::Codebook CB>
cudaError_t launch_moe_gemv_cb(const MoeGemvArgs& a, int nt, int max_groups, cudaStream_t stream);

}  // namespace exl3::cuda::detail
