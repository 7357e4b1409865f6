// Schema check of a MoE layer's tensor names (see name_scan.hpp).
#include "moe/name_scan.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "exl3/error.hpp"

namespace exl3::moe {
namespace {

int parse_index(std::string_view s) {
  if (s.empty() || s.size() > 9 || (s.size() > 1 && s[0] == '0')) return -1;
  int v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::vector<std::string_view> split_dots(std::string_view s) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t dot = s.find('.', start);
    parts.push_back(s.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

std::optional<Proj> parse_proj(std::string_view s, const ExpertNaming& n) {
  for (const Proj p : kProjs) {
    if (s == proj_name(p, n)) return p;
  }
  return std::nullopt;
}

class NameChecker {
 public:
  NameChecker(const TensorStore& store, const MoeLayout& layout, bool expert_biases)
      : store_(store), layout_(layout), expert_biases_(expert_biases) {}

  void check(const std::string& name, std::string_view rest) {
    name_ = &name;
    const auto parts = split_dots(rest);
    if (parts[0] == "shared_h") return shared_row(parts);
    const int expert = parse_index(parts[0]);
    if (expert < 0) bad("is not an expert tensor (expected experts.{E}.{proj}...)", "");
    if (expert >= layout_.num_experts) {
      bad(fmt::format("expert id {} is outside 0..{} (experts_per_layer {})", expert,
                      layout_.num_experts - 1, layout_.num_experts),
          "the checkpoint holds more experts than its metadata declares");
    }
    layout_.rank_sliced() ? sliced_expert(parts) : plain_expert(parts);
  }

 private:
  [[noreturn]] void bad(const std::string& what, const std::string& hint) const {
    const TensorRef* ref = store_.find(*name_);
    fail("{}: tensor '{}': {} (layout {}, declared by {}){}{}", ref->path().string(), *name_, what,
         rotation_layout_name(layout_.rotation), layout_.label,
         hint.empty() ? "" : "; hint: ", hint);
  }

  Proj proj(std::string_view s) const {
    const auto p = parse_proj(s, layout_.naming);
    if (!p)
      bad(fmt::format("unknown projection '{}'", s),
          fmt::format("experts here have {}, {} and {}", layout_.naming.proj[0],
                      layout_.naming.proj[1], layout_.naming.proj[2]));
    return *p;
  }

  int rank(std::string_view s) const {
    const int r = s.starts_with("rank") ? parse_index(s.substr(4)) : -1;
    if (r < 0) bad(fmt::format("'{}' is not a rank component rank{{r}}", s), "");
    if (r >= layout_.tp) {
      bad(fmt::format("rank {} is outside 0..{} (tp {})", r, layout_.tp - 1, layout_.tp),
          "a slice for another TP; the metadata and the tensors disagree");
    }
    return r;
  }

  void no_bias(std::string_view field) const {
    if (field == "bias") bad("expert biases are not supported", "the fused MoE has no bias term");
  }

  void shared_row(const std::vector<std::string_view>& parts) const {
    if (layout_.rotation != RotationLayout::kSharedH) {
      bad("is a shared-H row, but the checkpoint does not declare rotation_layout shared_h_v1",
          "undeclared shared-H tensors are refused: declare shared_h_v1 with "
          "shared_h_tensor_schema, or store the vectors per expert");
    }
    if (parts.size() != 4) bad(fmt::format("is not in the schema '{}'", kSharedHSchema), "");
    const Proj p = proj(parts[1]);
    rank(parts[2]);
    if (parts[3] != hidden_side_field(p)) {
      bad(fmt::format("wrong field '{}' on a shared row: {} shares only its {}", parts[3],
                      proj_name(p), hidden_side_field(p)),
          "shared_h_v1 shares gate/up suh and down svh (the hidden side); the intermediate side "
          "stays per expert");
    }
  }

  void sliced_expert(const std::vector<std::string_view>& parts) const {
    if (parts.size() != 4) bad(fmt::format("is not in the schema '{}'", kRankSlicedSchema), "");
    const Proj p = proj(parts[1]);
    rank(parts[2]);
    const std::string_view f = parts[3];
    no_bias(f);
    if (f != "trellis" && f != "suh" && f != "svh" && f != "mcg" && f != "mul1") {
      bad(fmt::format("unknown field '{}'", f), "rank-sliced experts hold trellis, suh, svh, mcg");
    }
    if (layout_.rotation == RotationLayout::kSharedH && f == hidden_side_field(p)) {
      bad(fmt::format("an expert id carries the hidden-side '{}' under shared_h_v1", f),
          fmt::format("shared_h_v1 stores it once per layer and rank as "
                      "'model.layers.{{L}}.mlp.experts.shared_h.{}.rank{{r}}.{}'",
                      proj_name(p), f));
    }
  }

  void plain_expert(const std::vector<std::string_view>& parts) const {
    if (parts.size() == 4 && parts[2].starts_with("rank")) {
      bad("is a rank-sliced expert tensor, but config.json has no hybrid_tr3_tail",
          "rank-sliced checkpoints declare tp and layout there (refusing to guess)");
    }
    if (parts.size() != 3) bad("is not experts.{E}.{proj}.{field}", "");
    proj(parts[1]);
    const std::string_view f = parts[2];
    if (expert_biases_ && f == "bias") return;  // the model's experts have biases (gpt-oss)
    no_bias(f);
    constexpr std::string_view kFields[] = {"trellis", "suh", "svh", "su", "sv", "mcg", "mul1"};
    if (std::find(std::begin(kFields), std::end(kFields), f) == std::end(kFields)) {
      bad(fmt::format("unknown field '{}'", f),
          "EXL3 experts hold trellis, suh/svh (or su/sv), mcg/mul1");
    }
  }

  const TensorStore& store_;
  const MoeLayout& layout_;
  const std::string* name_ = nullptr;
  bool expert_biases_ = false;
};

}  // namespace

void check_layer_names(const TensorStore& store, const MoeLayout& layout, int layer,
                       bool expert_biases) {
  const std::string prefix = fmt::format("model.layers.{}.{}.experts.", layer, layout.naming.block);
  const auto& names = store.names();  // sorted
  NameChecker checker(store, layout, expert_biases);
  for (auto it = std::lower_bound(names.begin(), names.end(), prefix);
       it != names.end() && it->starts_with(prefix); ++it) {
    checker.check(*it, std::string_view(*it).substr(prefix.size()));
  }
}

}  // namespace exl3::moe
