// libFuzzer target: parse_exl3_manifest on arbitrary manifest bytes, then the extent planner for
// every TP and rank on each listed layer. Parsing must succeed or throw exl3::Error; a parsed
// manifest's extents must partition its slots (or the planner must refuse with exl3::Error).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "exl3/error.hpp"
#include "exl3/format/exl3_manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  exl3::Exl3Manifest m;
  try {
    m = exl3::parse_exl3_manifest(text, "fuzz");
  } catch (const exl3::Error&) {
    return 0;
  }
  const int64_t slots = m.geometry.num_slots;
  if (slots <= 0 || m.layers.size() != m.geometry.moe_layer_indices.size()) std::abort();
  if (slots > 4096) return 0;  // keep each input cheap
  for (const auto& [layer, entry] : m.layers) {
    if (entry.sha256.size() != 64 || entry.file.empty()) std::abort();
    for (int tp = exl3::kExl3MinTp; tp <= exl3::kExl3MaxTp; ++tp) {
      std::vector<int> owner(static_cast<size_t>(slots), 0);
      try {
        for (int r = 0; r < tp; ++r) {
          const auto e = exl3::plan_exl3_extent(m, layer, tp, r);
          if (e.first_slot < 0 || e.slot_count < 0 || e.first_slot + e.slot_count > slots) std::abort();
          for (int64_t s = e.first_slot; s < e.first_slot + e.slot_count; ++s) ++owner[static_cast<size_t>(s)];
        }
      } catch (const exl3::Error&) {
        break;  // the layout has no valid barrier: the same for every TP
      }
      for (const int o : owner) {
        if (o != 1) std::abort();
      }
    }
    break;  // one layer suffices: the rule depends on the layer only through the rotation
  }
  return 0;
}
