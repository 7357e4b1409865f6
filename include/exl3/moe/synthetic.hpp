// Synthetic MoE checkpoints in every expert layout (plain exllamav3, rank-sliced per_expert_v1
// and shared_h_v1), uniform or mixed K: random but valid trellis bits (any int16 words decode)
// and fp16 rotation vectors of magnitude ~1 with random signs. For tests and demos only: the
// weights are noise.
//
// The numbers do not depend on the layout or TP: every expert's full (unsliced) tensors are drawn
// in one fixed order from the seed and then sliced per rank, so a TP-2 shared_h_v1 checkpoint and
// a plain TP-1 one written from the same spec (with shared_h_values set) describe the same layer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "exl3/moe/layout.hpp"
#include "exl3/trellis/codebook.hpp"

namespace exl3::moe {

struct SyntheticMoeSpec {
  int64_t hidden_size = 256;        // H, a multiple of 128
  int64_t intermediate_size = 256;  // full I; I / tp must be a multiple of 128
  int num_experts = 4;
  int top_k = 2;
  int tp = 1;           // must be 1 for RotationLayout::kPlain
  int first_layer = 1;  // MoE layers first_layer..last_layer
  int last_layer = 1;
  RotationLayout rotation = RotationLayout::kPerExpert;
  int bits = 3;  // uniform K
  // Mixed K: one entry per expert (all layers), written as `bits: "mixed"` + tier_bitmap.json.
  std::vector<int> expert_bits;
  trellis::Codebook codebook = trellis::Codebook::kMcg;  // rank-sliced needs mcg
  // Draw one hidden-side vector per layer and projection for all experts (what shared_h_v1
  // stores); always on for kSharedH.
  bool shared_h_values = false;
  bool one_file_per_rank = false;  // model-rank{r}.safetensors + index, else model.safetensors
  uint64_t seed = 1;
};

struct SyntheticMoeResult {
  std::filesystem::path dir;
  int64_t num_tensors = 0;
  uint64_t bytes = 0;
};

// Writes config.json (with hybrid_tr3_tail unless plain), tier_bitmap.json (mixed only) and the
// safetensors files into `dir` (created if needed). Router weights `mlp.gate.weight` F32 [E, H]
// are written too. Throws exl3::Error for an invalid spec.
SyntheticMoeResult write_synthetic_moe(const std::filesystem::path& dir, SyntheticMoeSpec spec);

}  // namespace exl3::moe
