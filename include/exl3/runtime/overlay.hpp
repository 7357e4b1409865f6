// The MXFP8 overlay policy: which unquantized (BF16/F16/F32) linears the runtime converts to
// MXFP8 when it loads a model (rules, format and user guide: docs/mxfp8.md).
//
//   CLI:    --overlay linear=mxfp8,shared_experts=mxfp8 [--overlay-ignore NAME]...
//   config: {"linear": {"weight": "mxfp8"}, "shared_experts": {"weight": "mxfp8"},
//            "ignore": ["lm_head", "re:.*\\.q_a_proj$", "kv_a_proj_with_mqa"]}
//
// Rules (each fails closed with an exl3::Error naming the layer):
//   - Only unquantized linears are eligible; EXL3 linears and routed experts keep their method.
//   - `linear` covers attention and dense-MLP projections, `shared_experts` the shared-expert MLP;
//     the two are independent (`linear` never selects a shared expert).
//   - lm_head is never overlaid.
//   - A linear whose input width is not a multiple of 32 stays unquantized (reported).
//   - Ignore entries are unfused checkpoint prefixes: an exact prefix, a last component
//     ("kv_a_proj_with_mqa" matches every "...kv_a_proj_with_mqa"), or "re:REGEX" matched
//     against the whole prefix (ECMAScript).
//   - Fused groups (q/k/v, gate/up) must agree: shards that mix EXL3 and unquantized storage, or
//     that the policy would treat differently (e.g. an ignore entry hitting k_proj alone), raise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/format/dtype.hpp"

namespace exl3 {
class Checkpoint;
}
namespace exl3::model {
struct ModelSpec;
}

namespace exl3::runtime {
// The runtime runs the model layer's descriptions and plans: their names are its vocabulary.
using namespace exl3::model;  // NOLINT(google-build-using-namespace)

struct OverlayPolicy {
  bool linear = false;          // attention and dense-MLP projections -> MXFP8
  bool shared_experts = false;  // shared-expert projections -> MXFP8
  std::vector<std::string> ignore;

  bool any() const { return linear || shared_experts; }
  // Whether `prefix` matches an ignore entry.
  bool ignored(std::string_view prefix) const;
};

// "linear=mxfp8,shared_experts=mxfp8" (either key alone; "none" or "" = no overlay). Throws
// naming the bad item and the accepted forms.
OverlayPolicy parse_overlay_spec(std::string_view spec);
// The JSON form (vLLM's quantization-config spelling); `label` names the source in errors.
OverlayPolicy parse_overlay_config(const nlohmann::json& j, const std::string& label);
OverlayPolicy load_overlay_config(const std::filesystem::path& path);

// Where a linear sits in the model, which decides the policy key that governs it.
enum class LinearRole : uint8_t { kLinear, kSharedExpert, kLmHead };

// What the loader does with one linear prefix.
enum class OverlayAction : uint8_t {
  kKeep,   // as stored (EXL3, unquantized, or already MXFP8 in the checkpoint)
  kMxfp8,  // convert the unquantized weight to MXFP8 at load
};

struct OverlayDecision {
  OverlayAction action = OverlayAction::kKeep;
  std::string reason;  // why it is kept ("exl3", "lm_head", "ignored", "width 4304 % 32", ...)
};

// Every linear of `spec` with its decision. Throws on fused groups that disagree.
class OverlayPlan {
 public:
  static OverlayPlan build(const OverlayPolicy& policy, const Checkpoint& ckpt,
                           const ModelSpec& spec);

  // The decision for `prefix` (kKeep for prefixes the plan does not list).
  OverlayDecision decision(const std::string& prefix) const;
  bool converts(const std::string& prefix) const {
    return decision(prefix).action == OverlayAction::kMxfp8;
  }
  const std::map<std::string, OverlayDecision>& decisions() const { return decisions_; }

 private:
  std::map<std::string, OverlayDecision> decisions_;
};

// One linear as loaded: what it was, what it became.
struct OverlayLayerReport {
  std::string name;
  int64_t out = 0, in = 0;
  DType source = DType::kBF16;
  size_t source_bytes = 0, mxfp8_bytes = 0;
  double rel_l2 = 0.0;  // vs the source (0 when loaded already MXFP8 from the checkpoint)
  double max_abs = 0.0;
  bool from_checkpoint = false;
};

struct OverlayReport {
  std::vector<OverlayLayerReport> layers;
  std::vector<std::pair<std::string, std::string>> kept_unquantized;  // (prefix, reason)

  size_t saved_bytes() const;
  nlohmann::json to_json() const;
};

}  // namespace exl3::runtime
