// Checks every tensor name under `model.layers.{L}.{block}.experts.` (the layout's naming; all
// ranks: names only, no
// data) against the layout's schema, so a tensor the loader would silently skip is an error:
//   rank-sliced  `{E}.{proj}.rank{r}.{trellis|suh|svh|mcg|mul1}` and, under shared_h_v1 only,
//                `shared_h.{proj}.rank{r}.{suh for gate/up | svh for down}`; under shared_h_v1
//                an expert id may not carry its hidden-side vector
//   plain        `{E}.{proj}.{trellis|suh|svh|su|sv|mcg|mul1}`
// with E < experts_per_layer, r < tp, proj in gate_proj/up_proj/down_proj, and no biases unless
// `expert_biases` (plain experts only: `{E}.{proj}.bias`, gpt-oss).
#pragma once

#include "exl3/format/safetensors.hpp"
#include "exl3/moe/layout.hpp"

namespace exl3::moe {

void check_layer_names(const TensorStore& store, const MoeLayout& layout, int layer,
                       bool expert_biases = false);

}  // namespace exl3::moe
