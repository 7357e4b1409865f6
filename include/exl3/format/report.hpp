// Human and machine readable summaries of a checkpoint (what `exl3 inspect` prints).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "exl3/format/checkpoint.hpp"

namespace exl3 {

// One JSON document: {"path", "model" (config summary or null), "linears": [...], "tensors":
// [...], "moe_layers": [...], "totals": {...}}. Each linear has at least name, in_features,
// out_features, bits, codebook ("3inst"|"mcg"|"mul1"), rotation ("suh_svh"|"su_sv"), bias,
// bytes, bits_per_weight.
nlohmann::json checkpoint_report(const Checkpoint& ckpt);

// The same content as aligned text tables.
std::string render_report_text(const nlohmann::json& report);

}  // namespace exl3
