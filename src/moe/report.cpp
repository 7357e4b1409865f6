// The MoE part of `exl3 inspect` (see report.hpp).
#include "exl3/moe/report.hpp"

#include <map>
#include <set>

#include "exl3/moe/layout.hpp"

namespace exl3::moe {
namespace {

// Ranks with at least one expert trellis, per layer (plain experts count as rank 0).
std::map<int, std::set<int>> ranks_present(const Checkpoint& ckpt) {
  std::map<int, std::set<int>> out;
  for (const auto& l : ckpt.linears()) {
    if (!l.expert || l.expert->layer < 0) continue;
    const auto& proj = l.expert->proj;
    const size_t dot = proj.find(".rank");
    int rank = 0;
    if (dot != std::string::npos) {
      try {
        rank = std::stoi(proj.substr(dot + 5));
      } catch (const std::exception&) {
        continue;
      }
    }
    out[l.expert->layer].insert(rank);
  }
  return out;
}

}  // namespace

void annotate_report(nlohmann::json& report, const Checkpoint& ckpt) {
  // A lone shard of a rank-sliced checkpoint has no config.json to say how it was sliced;
  // inspect still shows its tensors (loading it fails closed).
  const auto ranks = ranks_present(ckpt);
  bool sliced = false;
  for (const auto& l : ckpt.linears())
    sliced |= l.expert && l.expert->proj.find(".rank") != std::string::npos;
  if (!ckpt.config() && sliced) {
    report["moe"] = nullptr;
    return;
  }
  const auto layout = read_moe_layout(ckpt);
  if (!layout) {
    report["moe"] = nullptr;
    return;
  }
  report["moe"] = {{"layout", std::string(rotation_layout_name(layout->rotation))},
                   {"tp", layout->tp},
                   {"experts_per_layer", layout->num_experts},
                   {"layers", layout->layers.size()},
                   {"mixed", layout->mixed},
                   {"k_values", layout->k_values},
                   {"bits_source", layout->bits_source}};

  std::map<int, nlohmann::json> by_layer;
  for (const auto& m : report["moe_layers"]) by_layer[m["layer"].get<int>()] = m;
  for (const int layer : layout->layers) {
    auto& m = by_layer[layer];
    if (m.is_null()) {
      m = {{"layer", layer}, {"num_experts", 0}, {"bits_histogram", nlohmann::json::object()}};
    }
    const auto sig = tier_signature(layout->bits_of(layer));
    const auto it = ranks.find(layer);
    m["layout"] = std::string(rotation_layout_name(layout->rotation));
    m["tp"] = layout->tp;
    m["ranks_present"] = it == ranks.end() ? 0 : it->second.size();
    m["tier_signature"] = sig;
    m["tier_signature_text"] = format_tier_signature(sig);
  }
  nlohmann::json moe_layers = nlohmann::json::array();
  for (auto& [layer, m] : by_layer) moe_layers.push_back(std::move(m));
  report["moe_layers"] = std::move(moe_layers);
}

}  // namespace exl3::moe
