// The MoE part of `exl3 inspect`: layout, TP and tiers of a checkpoint's routed experts.
#pragma once

#include <nlohmann/json.hpp>

#include "exl3/format/checkpoint.hpp"

namespace exl3::moe {

// Adds to a checkpoint_report() document:
//   "moe": null, or {"layout": "plain"|"per_expert_v1"|"shared_h_v1", "tp", "experts_per_layer",
//          "layers" (count), "mixed", "k_values", "bits_source"}
//   and in every "moe_layers" entry: "layout", "tp", "ranks_present", "tier_signature"
//   ([[K, experts], ...]; K 0 = a plain expert whose projections differ) and
//   "tier_signature_text" ("((3,148),(4,108))"). MoE layers the metadata declares but the
//   tensors lack appear with num_experts 0 and ranks_present 0.
// Throws exl3::Error when the MoE metadata fails validation (inspect fails closed like a load).
void annotate_report(nlohmann::json& report, const Checkpoint& ckpt);

}  // namespace exl3::moe
