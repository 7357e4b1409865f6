// MoE routers in FP32: router logits [m, E] (the caller computes x @ W_router^T) -> the top-k
// expert ids int32 [m, k] and weights fp32 [m, k].
//
// Selection is deterministic: among equal scores the lower expert id wins (and the lower group
// id when groups tie), as torch.topk does on CPU. The k routes of a token are ordered by
// descending selection score, ties by ascending id. Non-finite logits are rejected (a NaN would
// make the choice depend on comparison order).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace exl3::moe {

struct TopK {
  int64_t m = 0;                    // tokens
  int k = 0;                        // routes per token
  std::vector<int32_t> ids = {};    // [m, k] expert ids
  std::vector<float> weights = {};  // [m, k]
};

// Qwen3-MoE / Mixtral style: p = softmax(logits) over all experts, pick the k largest p, and
// with `renormalize` (Qwen3's norm_topk_prob) divide the chosen p by their sum.
struct SoftmaxRouting {
  int top_k = 2;
  bool renormalize = true;
};
TopK route_softmax(std::span<const float> logits, int64_t m, int64_t num_experts,
                   const SoftmaxRouting& r);

// DeepSeek-V3 / GLM-4.5+ style ("noaux_tc"):
//   s = sigmoid(logits); c = s + e_score_correction_bias (selection only)
//   groups: experts split into n_group equal groups; a group's score is the sum of its top-2 c
//   (its single c when a group has one expert); the topk_group best groups stay eligible
//   pick the top_k largest c among eligible experts (ineligible ones never win, even when every
//   eligible c is negative: they are masked to -inf like vLLM's grouped_topk, where transformers
//   masks to 0)
//   weights = s of the chosen experts (uncorrected), / (sum + 1e-20) when renormalize, times
//   routed_scaling_factor.
struct SigmoidGroupedRouting {
  int top_k = 8;
  int n_group = 1;
  int topk_group = 1;
  bool renormalize = true;  // norm_topk_prob
  float routed_scaling_factor = 1.0f;
  std::span<const float> correction_bias = {};  // [E]; empty = zeros
};
TopK route_sigmoid_grouped(std::span<const float> logits, int64_t m, int64_t num_experts,
                           const SigmoidGroupedRouting& r);

}  // namespace exl3::moe
