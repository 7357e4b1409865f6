// Fused CUDA MoE layer (routed experts of one layer on one rank): x, top-k ids and weights in,
// the FP32 top-k weighted sum of the expert MLPs out.
//
//   per route (t, j), expert e = ids[t, j]:
//     g = gate_e(x_t), u = up_e(x_t)           EXL3 trellis GEMV, e's own K
//     a = SiLU(g) * u                          with the intermediate rotations in between
//     d = down_e(a)
//   out_t = sum_j weights[t, j] * d           FP32, route order j = 0..k-1
// (gpt-oss: biases on g, u and d, a clamped SwiGLU and padded experts; MoeExpertExtras.)
//
// Paths, chosen by m (MoeLayerCuda::plan, exl3/cuda/plan.hpp; split-K and chunking from (H, I,
// E, top-k, tiers, capacity) and the SM count):
//   decode  (m <= decode_max_m): every route is its own group (no packing), the input rotation
//           per token (shared-H) or per route (per-expert suh), split-K FC1 and FC2 over the
//           routes' experts in one grid each, then activation and combine kernels.
//   prefill (m > decode_max_m): routes packed by expert on the device (counts, prefix offsets,
//           groups of up to 32 slots) so each expert's tile is decoded once per 32 routes;
//           processed in chunks of prefill_chunk tokens so the arena stays within budget.
// Mixed bitrates (e.g. 148 K3 + 108 K4 experts) run in one grid: each block decodes its
// expert's K. With shared_h_v1 the hidden-side rotations run per token, not per route, and the
// down projection's output rotation and svh run once per token after the weighted sum (both are
// linear), which cuts scratch and work.
//
// Execution contract (CUDA graphs): run() only launches kernels and memsets on the stream (no
// allocation, no sync, no host control flow on device data); all scratch is the caller-owned
// arena of arena_bytes(); a graph captured at any m <= capacity replays bit-identical to eager.
// Router ids outside [0, E) are skipped (the route contributes nothing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "exl3/cuda/device_buffer.hpp"
#include "exl3/cuda/linear.hpp"
#include "exl3/cuda/plan.hpp"
#include "exl3/moe/layout.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::moe {
struct MoeLayerWeights;
}

namespace exl3::cuda {
namespace detail {
struct MoeGemvArgs;
}

// What gpt-oss's experts add to the plain SwiGLU expert; the defaults are the plain expert.
struct MoeExpertExtras {
  // Host fp32 biases added to each projection's output: gate / up [E, gate_up_width], down
  // [E, down_width] (widths at most the layer's I / H: a padded layer's real channels, the rest
  // taken as zeros); empty = none. Not with shared-H rotations.
  std::vector<float> gate_bias, up_bias, down_bias;
  int64_t gate_up_width = 0, down_width = 0;
  // limit > 0: a = min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit, limit) + 1)
  // instead of SiLU(g) * u.
  float swiglu_alpha = 0.0f, swiglu_limit = 0.0f;
  // Intermediate channels from here on pad padded expert linears: their activation is zero, as
  // if the padded linear's output had been cut there. 0 = none.
  int64_t valid_intermediate = 0;
};

class MoeLayerCuda {
 public:
  // Uploads the layer (one device slab for all trellises, rotation tables as loaded: shared-H
  // rows stay one [1, H] row). Throws exl3::Error on invalid options or CUDA failures.
  MoeLayerCuda(const moe::MoeLayerWeights& w, int top_k, const MoeOptions& opts,
               const MoeExpertExtras& extras = {});
  MoeLayerCuda(const MoeLayerCuda&) = delete;
  MoeLayerCuda& operator=(const MoeLayerCuda&) = delete;

  int64_t hidden() const { return H_; }
  int64_t intermediate() const { return I_; }
  int num_experts() const { return E_; }
  int top_k() const { return k_; }
  const MoeOptions& options() const { return opts_; }
  const MoeShape& shape() const { return shape_; }
  const MoeTraits& traits() const { return traits_; }

  // What run() does at m tokens: plan_moe(shape(), options(), traits(), m).
  MoePlan plan(int64_t m) const;
  // The planner's answers, for reports and tests.
  int64_t prefill_chunk() const;
  MoePath path_for(int64_t m) const;
  // Split-K of FC1 / FC2 on the decode path (prefill passes plan their own).
  std::pair<int, int> decode_splits() const;
  // The distinct K of the experts (ascending), and whether a path runs them as per-K passes.
  const std::vector<int>& tiers() const { return tiers_; }
  bool tier_passes(MoePath p) const;
  // Bytes of the caller-owned scratch arena run() needs for any m <= capacity.
  size_t arena_bytes() const;
  // Device bytes this layer holds (trellis slab + tables).
  size_t device_bytes() const { return device_bytes_; }

  // Runs `plan` (from plan(m) of this layer): x [m, H] (in_type), topk_ids int32 [m, k],
  // topk_weights fp32 [m, k] -> out fp32 [m, H] (overwritten); all device pointers; m in
  // 1..capacity. Only launches. Returns the first CUDA error; cudaErrorInvalidValue for m
  // outside 1..capacity or a short arena.
  cudaError_t run(const MoePlan& plan, const void* x, DType in_type, const int32_t* topk_ids,
                  const float* topk_weights, float* out, void* arena, size_t arena_size,
                  cudaStream_t stream) const;
  // run(plan(m), ...).
  cudaError_t run(const void* x, DType in_type, const int32_t* topk_ids, const float* topk_weights,
                  float* out, int64_t m, void* arena, size_t arena_size, cudaStream_t stream) const;

 private:
  void upload_extras(const MoeExpertExtras& x, const std::string& where);
  cudaError_t grouped_matmul(detail::MoeGemvArgs& a, int group, int max_groups, bool per_k_passes,
                             cudaStream_t stream) const;
  cudaError_t run_pass(const void* x, DType in_type, const int32_t* ids, const float* weights,
                       float* out, const MoePlan& plan, const MoePass& pass, void* arena,
                       cudaStream_t stream) const;

  int64_t H_ = 0, I_ = 0;
  int E_ = 0, k_ = 0;
  bool shared_h_ = false;
  trellis::Codebook cb_ = trellis::Codebook::kMcg;
  MoeOptions opts_;
  MoeShape shape_;
  MoeTraits traits_;
  std::vector<int> tiers_;
  size_t device_bytes_ = 0;
  // Device allocations.
  DeviceBuffer slab_;          // all trellises
  DeviceBuffer ptrs_;          // [3][E] trellis pointers (gate, up, down)
  DeviceBuffer bits_;          // [3][E] int8 K
  DeviceBuffer gate_suh_;      // fp16 [h_rows, H]
  DeviceBuffer up_suh_;        // fp16 [h_rows, H]
  DeviceBuffer down_svh_;      // fp16 [h_rows, H]
  DeviceBuffer intermediate_;  // fp16 [E, 3I]
  // MoeExpertExtras on the device (empty when absent).
  DeviceBuffer gate_bias_, up_bias_;  // fp32 [E, I]
  DeviceBuffer down_bias_;            // fp32 [E, H]
  float swiglu_alpha_ = 0.0f, swiglu_limit_ = 0.0f;
  int64_t valid_intermediate_ = 0;
};

}  // namespace exl3::cuda
