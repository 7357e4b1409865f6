// MoE layout descriptions: names, tier signatures and the plain (discovered) layout. The
// hybrid_tr3_tail parser lives in hybrid_tr3_tail.cpp.
#include "exl3/moe/layout.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"

namespace exl3::moe {

std::string_view rotation_layout_name(RotationLayout layout) {
  switch (layout) {
    case RotationLayout::kPerExpert:
      return "per_expert_v1";
    case RotationLayout::kSharedH:
      return "shared_h_v1";
    default:
      return "plain";
  }
}

std::string_view proj_name(Proj p, const ExpertNaming& n) {
  return n.proj[static_cast<size_t>(p)];
}
std::string_view hidden_side_field(Proj p) {
  return p == Proj::kDown ? "svh" : "suh";
}
std::string_view intermediate_side_field(Proj p) {
  return p == Proj::kDown ? "suh" : "svh";
}

std::string expert_prefix(int layer, int expert, Proj p, int rank, const ExpertNaming& n) {
  std::string s =
      fmt::format("model.layers.{}.{}.experts.{}.{}", layer, n.block, expert, proj_name(p, n));
  if (rank >= 0) s += fmt::format(".rank{}", rank);
  return s;
}

std::string shared_h_name(int layer, Proj p, int rank) {
  return fmt::format("model.layers.{}.mlp.experts.shared_h.{}.rank{}.{}", layer, proj_name(p), rank,
                     hidden_side_field(p));
}

bool MoeLayout::has_layer(int layer) const {
  return expert_bits.count(layer) != 0;
}

const std::vector<int>& MoeLayout::bits_of(int layer) const {
  const auto it = expert_bits.find(layer);
  if (it == expert_bits.end()) {
    fail("{}: layer {} is not a MoE layer (MoE layers: {}); hint: pass one of those", label, layer,
         fmt::join(layers, ", "));
  }
  return it->second;
}

std::vector<std::pair<int, int>> tier_signature(const std::vector<int>& expert_bits) {
  std::map<int, int> counts;
  for (const int k : expert_bits) ++counts[k];
  return {counts.begin(), counts.end()};
}

std::string format_tier_signature(const std::vector<std::pair<int, int>>& signature) {
  std::string s = "(";
  for (size_t i = 0; i < signature.size(); ++i) {
    s += fmt::format("{}({},{})", i ? "," : "", signature[i].first, signature[i].second);
  }
  return s + ")";
}

namespace {

// `model.layers.{L}.{block}.experts.{E}.{proj}` in one of the known namings: {L, E, proj index,
// naming index}.
struct PlainExpert {
  int layer, expert, proj;
  size_t naming;
};
std::optional<PlainExpert> parse_plain_expert(const Exl3LinearInfo& l) {
  if (!l.expert || l.expert->layer < 0) return std::nullopt;
  for (size_t n = 0; n < std::size(kExpertNamings); ++n) {
    for (int p = 0; p < 3; ++p) {
      const ExpertNaming& naming = kExpertNamings[n];
      if (l.expert->proj == proj_name(kProjs[p], naming) &&
          l.prefix == expert_prefix(l.expert->layer, l.expert->expert, kProjs[p], -1, naming)) {
        return PlainExpert{l.expert->layer, l.expert->expert, p, n};
      }
    }
  }
  return std::nullopt;
}

// Experts found by discovery; rank-sliced names without hybrid_tr3_tail are refused, since TP and
// the rotation layout would have to be guessed.
std::optional<MoeLayout> plain_layout(const Checkpoint& ckpt) {
  std::map<int, std::map<int, std::array<int, 3>>> bits;  // layer -> expert -> K per proj
  std::set<int> ks;
  std::map<size_t, std::string> namings;  // naming index -> an example linear
  for (const auto& l : ckpt.linears()) {
    if (l.expert && l.expert->proj.find(".rank") != std::string::npos) {
      fail(
          "{}: EXL3 linear '{}' is a rank-sliced expert, but config.json has no hybrid_tr3_tail "
          "block; hint: rank-sliced checkpoints must declare tp, experts and layout there "
          "(refusing "
          "to guess)",
          ckpt.path().string(), l.prefix);
    }
    const auto e = parse_plain_expert(l);
    if (!e) continue;
    namings.emplace(e->naming, l.prefix);
    bits[e->layer][e->expert][static_cast<size_t>(e->proj)] = l.bits;
    ks.insert(l.bits);
  }
  if (bits.empty()) return std::nullopt;
  if (namings.size() > 1) {
    fail(
        "{}: the EXL3 experts are named two ways ('{}' and '{}'); refusing to guess which the "
        "model uses",
        ckpt.path().string(), namings.begin()->second, namings.rbegin()->second);
  }
  MoeLayout out;
  out.naming = kExpertNamings[namings.begin()->first];
  out.rotation = RotationLayout::kPlain;
  out.label = ckpt.path().string();
  out.bits_source = "tensors";
  out.k_values.assign(ks.begin(), ks.end());
  for (const auto& [layer, experts] : bits) {
    out.num_experts = std::max(out.num_experts, experts.rbegin()->first + 1);
  }
  for (const auto& [layer, experts] : bits) {
    out.layers.push_back(layer);
    auto& v = out.expert_bits[layer];
    v.assign(static_cast<size_t>(out.num_experts), 0);
    for (const auto& [e, k] : experts) {
      if (k[0] == k[1] && k[1] == k[2]) v[static_cast<size_t>(e)] = k[0];
    }
  }
  return out;
}

}  // namespace

void check_expert_naming(const MoeLayout& layout, std::string_view block,
                         const std::array<std::string, 3>& proj, const std::string& label) {
  const ExpertNaming& n = layout.naming;
  if (layout.rank_sliced() ? block == n.block
                           : block == n.block && proj[0] == n.proj[0] && proj[1] == n.proj[1] &&
                                 proj[2] == n.proj[2]) {
    return;
  }
  fail(
      "{}: the model's experts are '{}.experts.{{E}}.{{{},{},{}}}', but the checkpoint's EXL3 "
      "experts ({}) are '{}.experts.{{E}}.{{{},{},{}}}'; hint: the checkpoint was converted for "
      "another architecture",
      label, block, proj[0], proj[1], proj[2], layout.label, n.block, n.proj[0], n.proj[1],
      n.proj[2]);
}

std::optional<MoeLayout> read_moe_layout(const Checkpoint& ckpt) {
  if (ckpt.config()) {
    const auto& p = ckpt.path();
    auto layout = parse_hybrid_tr3_tail(ckpt.config()->raw, p, (p / "config.json").string());
    if (layout) return layout;
  }
  return plain_layout(ckpt);
}

}  // namespace exl3::moe
