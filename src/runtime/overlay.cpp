// The MXFP8 overlay policy: parsing (CLI spec, JSON config), the per-linear plan with its
// fail-closed fused-group checks, and the load report (see exl3/runtime/overlay.hpp).
#include "exl3/runtime/overlay.hpp"

#include <algorithm>
#include <regex>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/mxfp8/codec.hpp"
#include "exl3/mxfp8/weight.hpp"

namespace exl3::runtime {
namespace {

constexpr std::string_view kRegexPrefix = "re:";

std::regex compile_ignore(const std::string& entry, const std::string& label) {
  try {
    return std::regex(entry.substr(kRegexPrefix.size()), std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail("{}: ignore entry '{}' is not a valid regular expression ({})", label, entry, e.what());
  }
}

void validate_ignore(const std::vector<std::string>& ignore, const std::string& label) {
  for (const auto& e : ignore) {
    if (e.empty() || e == kRegexPrefix)
      fail("{}: empty ignore entry; give a prefix or 're:REGEX'", label);
    if (e.starts_with(kRegexPrefix)) compile_ignore(e, label);
  }
}

// "mxfp8" -> true, "bf16" / "none" -> false.
bool parse_format(std::string_view key, std::string_view value, const std::string& label) {
  if (value == "mxfp8") return true;
  if (value == "bf16" || value == "none") return false;
  fail(
      "{}: '{}' = '{}' is not a weight format; use mxfp8 (or bf16 / none to keep the layers "
      "unquantized)",
      label, key, value);
}

enum class Storage : uint8_t { kMissing, kExl3, kMxfp8, kDense };

Storage storage_of(const Checkpoint& ckpt, const std::string& prefix) {
  const auto& store = ckpt.store();
  if (ckpt.find_linear(prefix) != nullptr || store.contains(prefix + ".trellis"))
    return Storage::kExl3;
  if (mxfp8::Weight::stored_in(store, prefix)) return Storage::kMxfp8;
  if (store.contains(prefix + ".weight")) return Storage::kDense;
  return Storage::kMissing;
}

std::string_view storage_name(Storage s) {
  switch (s) {
    case Storage::kExl3:
      return "EXL3";
    case Storage::kMxfp8:
      return "MXFP8 (stored)";
    case Storage::kDense:
      return "unquantized";
    case Storage::kMissing:
      break;
  }
  return "missing";
}

struct Shard {
  std::string prefix;
  Storage storage;
  OverlayDecision decision;
};

class Planner {
 public:
  Planner(const OverlayPolicy& p, const Checkpoint& c, std::map<std::string, OverlayDecision>& out)
      : policy_(p), ckpt_(c), out_(out) {}

  // One fused group: shards that a fused kernel would run as one matrix.
  void group(const std::string& base, std::initializer_list<const char*> names, int64_t in,
             LinearRole role) {
    const bool on = role == LinearRole::kLinear
                        ? policy_.linear
                        : role == LinearRole::kSharedExpert && policy_.shared_experts;
    std::vector<Shard> shards;
    for (const char* n : names) {
      Shard s{base + "." + n, storage_of(ckpt_, base + "." + n), {}};
      s.decision = decide(s, in, role, on);
      shards.push_back(std::move(s));
    }
    if (on && shards.size() > 1) {
      const bool exl3 = std::any_of(shards.begin(), shards.end(),
                                    [](const Shard& s) { return s.storage == Storage::kExl3; });
      const bool dense = std::any_of(shards.begin(), shards.end(),
                                     [](const Shard& s) { return s.storage == Storage::kDense; });
      // The format each shard runs in: stored MXFP8 and converted shards agree.
      auto runs_mxfp8 = [](const Shard& s) {
        return s.storage == Storage::kMxfp8 || s.decision.action == OverlayAction::kMxfp8;
      };
      const bool disagree = std::any_of(shards.begin(), shards.end(), [&](const Shard& s) {
        return runs_mxfp8(s) != runs_mxfp8(shards.front());
      });
      if ((exl3 && dense) || disagree) {
        std::string detail;
        for (const auto& s : shards) {
          detail += fmt::format(
              "{}{} ({}, {})", detail.empty() ? "" : "; ", s.prefix, storage_name(s.storage),
              s.decision.action == OverlayAction::kMxfp8 ? "-> mxfp8"
                                                         : "kept: " + s.decision.reason);
        }
        fail(
            "{}: the fused shards of '{}' disagree under the MXFP8 overlay: {}; hint: ignore all "
            "of "
            "them or none (a fused layer runs as one matrix, in one format)",
            ckpt_.path().string(), base, detail);
      }
    }
    for (auto& s : shards) out_[s.prefix] = std::move(s.decision);
  }

  void mlp(const std::string& prefix, int64_t hidden, int64_t inter, LinearRole role) {
    group(prefix, {"gate_proj", "up_proj"}, hidden, role);
    group(prefix, {"down_proj"}, inter, role);
  }

 private:
  OverlayDecision decide(const Shard& s, int64_t in, LinearRole role, bool on) const {
    switch (s.storage) {
      case Storage::kExl3:
        return {OverlayAction::kKeep, "exl3"};
      case Storage::kMxfp8:
        return {OverlayAction::kKeep, "mxfp8 (checkpoint)"};
      case Storage::kMissing:
        return {OverlayAction::kKeep, "missing"};
      case Storage::kDense:
        break;
    }
    if (role == LinearRole::kLmHead) return {OverlayAction::kKeep, "lm_head is never overlaid"};
    if (!on)
      return {OverlayAction::kKeep,
              role == LinearRole::kSharedExpert ? "shared_experts off" : "linear off"};
    if (policy_.ignored(s.prefix)) return {OverlayAction::kKeep, "ignored"};
    if (in % mxfp8::kBlock != 0)
      return {OverlayAction::kKeep, fmt::format("input width {} is not a multiple of 32", in)};
    return {OverlayAction::kMxfp8, ""};
  }

  const OverlayPolicy& policy_;
  const Checkpoint& ckpt_;
  std::map<std::string, OverlayDecision>& out_;
};

}  // namespace

bool OverlayPolicy::ignored(std::string_view prefix) const {
  for (const auto& e : ignore) {
    if (e.starts_with(kRegexPrefix)) {
      if (std::regex_match(prefix.begin(), prefix.end(), compile_ignore(e, "overlay"))) return true;
    } else if (prefix == e) {
      return true;
    } else if (e.find('.') == std::string::npos) {  // a last component: "...kv_a_proj_with_mqa"
      const auto dot = prefix.rfind('.');
      if (dot != std::string_view::npos && prefix.substr(dot + 1) == e) return true;
    }
  }
  return false;
}

OverlayPolicy parse_overlay_spec(std::string_view spec) {
  OverlayPolicy p;
  if (spec.empty() || spec == "none") return p;
  bool seen_linear = false, seen_shared = false;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string_view::npos) end = spec.size();
    const std::string_view item = spec.substr(pos, end - pos);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      fail(
          "--overlay: item '{}' is not KEY=FORMAT; e.g. --overlay "
          "linear=mxfp8,shared_experts=mxfp8",
          item);
    }
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    bool& seen = key == "linear" ? seen_linear : seen_shared;
    if (key != "linear" && key != "shared_experts") {
      fail(
          "--overlay: key '{}' is unknown; the keys are linear and shared_experts (routed experts "
          "and EXL3 layers keep their own format)",
          key);
    }
    if (seen) fail("--overlay: key '{}' is given twice", key);
    seen = true;
    (key == "linear" ? p.linear : p.shared_experts) = parse_format(key, value, "--overlay");
    pos = end + 1;
  }
  return p;
}

OverlayPolicy parse_overlay_config(const nlohmann::json& j, const std::string& label) {
  if (!j.is_object()) fail("{}: the overlay config must be a JSON object", label);
  OverlayPolicy p;
  for (const auto& [key, value] : j.items()) {
    if (key == "linear" || key == "shared_experts") {
      if (!value.is_object()) {
        fail("{}: '{}' must be an object like {{\"weight\": \"mxfp8\"}}", label, key);
      }
      for (const auto& [k2, v2] : value.items()) {
        if (k2 != "weight") {
          fail("{}: '{}.{}' is not supported; only \"weight\" is (activations stay BF16)", label,
               key, k2);
        }
        if (!v2.is_string()) fail("{}: '{}.weight' must be a string", label, key);
      }
      if (!value.contains("weight")) fail("{}: '{}' has no \"weight\" format", label, key);
      (key == "linear" ? p.linear : p.shared_experts) =
          parse_format(key + ".weight", value["weight"].get<std::string>(), label);
    } else if (key == "ignore") {
      if (!value.is_array()) fail("{}: 'ignore' must be an array of strings", label);
      for (const auto& e : value) {
        if (!e.is_string()) fail("{}: 'ignore' holds {}, not a string", label, e.dump());
        p.ignore.push_back(e.get<std::string>());
      }
    } else {
      fail("{}: key '{}' is unknown; the keys are linear, shared_experts and ignore", label, key);
    }
  }
  validate_ignore(p.ignore, label);
  return p;
}

OverlayPolicy load_overlay_config(const std::filesystem::path& path) {
  const std::string text = read_text_file(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", path.string(), e.what());
  }
  return parse_overlay_config(j, path.string());
}

OverlayPlan OverlayPlan::build(const OverlayPolicy& policy, const Checkpoint& ckpt,
                               const ModelSpec& spec) {
  validate_ignore(policy.ignore, "overlay");
  OverlayPlan plan;
  Planner pl(policy, ckpt, plan.decisions_);
  const int64_t hidden = spec.hidden_size;
  for (const auto& layer : spec.layers) {
    if (const auto* a = std::get_if<GqaAttentionSpec>(&layer.attention)) {
      pl.group(a->prefix, {"q_proj", "k_proj", "v_proj"}, hidden, LinearRole::kLinear);
      pl.group(a->prefix, {"o_proj"}, a->num_heads * a->head_dim, LinearRole::kLinear);
    } else if (const auto* d = std::get_if<model::GatedDeltaNetSpec>(&layer.attention)) {
      pl.group(d->prefix, {"in_proj_qkvz", "in_proj_ba"}, hidden, LinearRole::kLinear);
      pl.group(d->prefix, {"out_proj"}, d->value_dim(), LinearRole::kLinear);
    } else {
      const auto& m = std::get<MlaAttentionSpec>(layer.attention);
      if (m.q_lora_rank > 0) {
        pl.group(m.prefix, {"q_a_proj", "kv_a_proj_with_mqa"}, hidden, LinearRole::kLinear);
        pl.group(m.prefix, {"q_b_proj"}, m.q_lora_rank, LinearRole::kLinear);
      } else {
        pl.group(m.prefix, {"q_proj", "kv_a_proj_with_mqa"}, hidden, LinearRole::kLinear);
      }
      pl.group(m.prefix, {"kv_b_proj"}, m.kv_lora_rank, LinearRole::kLinear);
      pl.group(m.prefix, {"o_proj"}, m.num_heads * m.v_head_dim, LinearRole::kLinear);
    }
    if (const auto* d = std::get_if<DenseMlpSpec>(&layer.mlp)) {
      pl.mlp(d->prefix, hidden, d->intermediate, LinearRole::kLinear);
    } else if (const auto& m = std::get<MoeSpec>(layer.mlp); m.shared) {
      pl.mlp(m.shared->prefix, hidden, m.shared->intermediate, LinearRole::kSharedExpert);
    }
  }
  if (!spec.lm_head_tied) {  // never overlaid, whatever its storage
    const Storage st = storage_of(ckpt, spec.lm_head);
    plan.decisions_[spec.lm_head] = {OverlayAction::kKeep, st == Storage::kDense
                                                               ? "lm_head is never overlaid"
                                                               : std::string(storage_name(st))};
  }
  return plan;
}

OverlayDecision OverlayPlan::decision(const std::string& prefix) const {
  const auto it = decisions_.find(prefix);
  return it == decisions_.end() ? OverlayDecision{OverlayAction::kKeep, "not planned"} : it->second;
}

size_t OverlayReport::saved_bytes() const {
  size_t s = 0;
  for (const auto& l : layers)
    s += l.source_bytes > l.mxfp8_bytes ? l.source_bytes - l.mxfp8_bytes : 0;
  return s;
}

nlohmann::json OverlayReport::to_json() const {
  nlohmann::json layers_j = nlohmann::json::array(), kept_j = nlohmann::json::array();
  size_t src = 0, mx = 0;
  for (const auto& l : layers) {
    layers_j.push_back({{"name", l.name},
                        {"out", l.out},
                        {"in", l.in},
                        {"source", dtype_name(l.source)},
                        {"source_bytes", l.source_bytes},
                        {"mxfp8_bytes", l.mxfp8_bytes},
                        {"rel_l2", l.rel_l2},
                        {"max_abs", l.max_abs},
                        {"from_checkpoint", l.from_checkpoint}});
    src += l.source_bytes;
    mx += l.mxfp8_bytes;
  }
  for (const auto& [name, reason] : kept_unquantized)
    kept_j.push_back({{"name", name}, {"reason", reason}});
  return {{"layers", layers_j},
          {"kept_unquantized", kept_j},
          {"source_bytes", src},
          {"mxfp8_bytes", mx},
          {"saved_bytes", saved_bytes()}};
}

}  // namespace exl3::runtime
