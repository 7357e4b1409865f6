// How a checkpoint stores its routed experts (docs/moe-layouts.md).
//
// Two families are understood:
//   plain        exllamav3's per-expert linears, `model.layers.{L}.mlp.experts.{E}.{proj}.{field}`,
//                one rank (TP 1); each projection may have its own K.
//   rank-sliced  config.json carries a `hybrid_tr3_tail` block; every expert projection is cut
//                for tensor parallelism and stored per rank as `....{proj}.rank{r}.{field}`:
//                gate/up are N-sliced (rank r owns intermediate rows [I_loc*r, I_loc*(r+1))),
//                down is K-sliced. Rotation layout per_expert_v1 (every expert keeps all its
//                vectors) or shared_h_v1 (the hidden-side vectors, gate/up suh and down svh, are
//                one row per layer and rank under `experts.shared_h`).
//
// parse_hybrid_tr3_tail validates the metadata and fails closed on anything it cannot interpret
// (blank, ambiguous, undeclared or unsupported values); errors name config.json (or the tier
// bitmap file), the key and the problem, and end with a hint.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl3 {
class Checkpoint;
}

namespace exl3::moe {

enum class RotationLayout : uint8_t {
  kPlain,      // exllamav3 per-expert linears, no rank slicing
  kPerExpert,  // rank-sliced, `per_expert_v1` (also the meaning of an absent rotation_layout)
  kSharedH,    // rank-sliced, `shared_h_v1`
};
// "plain" | "per_expert_v1" | "shared_h_v1"
std::string_view rotation_layout_name(RotationLayout layout);

enum class Proj : uint8_t { kGate, kUp, kDown };
inline constexpr Proj kProjs[] = {Proj::kGate, Proj::kUp, Proj::kDown};

// How a family names its routed experts, `model.layers.{L}.{block}.experts.{E}.{proj}`: the
// block and the gate, up and down projections. Rank-sliced layouts use the first only.
struct ExpertNaming {
  std::string_view block = "mlp";
  std::array<std::string_view, 3> proj = {"gate_proj", "up_proj", "down_proj"};
  bool operator==(const ExpertNaming&) const = default;
};
inline constexpr ExpertNaming kMlpExperts{};  // Qwen3-MoE, GLM-4.5, DeepSeek-V3, ...
inline constexpr ExpertNaming kMixtralExperts{"block_sparse_moe", {"w1", "w3", "w2"}};
inline constexpr ExpertNaming kExpertNamings[] = {kMlpExperts, kMixtralExperts};

std::string_view proj_name(Proj p, const ExpertNaming& n = kMlpExperts);  // "gate_proj" | ...
// The hidden-side vector of a projection: gate/up read x (suh), down writes the output (svh).
std::string_view hidden_side_field(Proj p);        // "suh" | "svh"
std::string_view intermediate_side_field(Proj p);  // "svh" | "suh"

// The two schema strings rank-sliced metadata must declare verbatim.
inline constexpr std::string_view kRankSlicedSchema =
    "model.layers.{L}.mlp.experts.{E}.{proj}.rank{r}.{trellis|suh|svh|mcg}";
inline constexpr std::string_view kSharedHSchema =
    "model.layers.{L}.mlp.experts.shared_h.{proj}.rank{r}.{suh|svh}";
// The MCG multiplier rank-sliced checkpoints may echo as `mcg_multiplier` (0xCBAC1FED).
inline constexpr uint64_t kMcgMultiplier = 3417055213u;
// K values a rank-sliced checkpoint may declare: uniform `bits` / trellis_bits_by_layer take the
// MCG kernels' set; mixed `k_values` are two or more distinct K in the 3..6 the fused mixed-tier
// kernels support (a single value is a uniform checkpoint), each used by some expert.
inline constexpr int kUniformBits[] = {3, 4, 5, 6, 8};
inline constexpr int kMixedMinBits = 3, kMixedMaxBits = 6;

// Tensor names. rank < 0 gives the plain (exllamav3) spelling without `.rank{r}`.
std::string expert_prefix(int layer, int expert, Proj p, int rank,
                          const ExpertNaming& n = kMlpExperts);
std::string shared_h_name(int layer, Proj p,
                          int rank);  // `...experts.shared_h.{proj}.rank{r}.{suh|svh}`

// The MoE storage description of one checkpoint.
struct MoeLayout {
  RotationLayout rotation = RotationLayout::kPlain;
  int tp = 1;               // ranks the experts are sliced over (1 for plain)
  int num_experts = 0;      // experts per MoE layer
  std::vector<int> layers;  // MoE layer indices, ascending
  // Per layer, K of every expert (index = expert id). Rank-sliced checkpoints declare one K per
  // expert for all three projections; plain ones record it when the three agree and 0 when
  // they differ (each projection then keeps its own K, see MoeLayerWeights).
  std::map<int, std::vector<int>> expert_bits;
  std::vector<int> k_values;  // distinct K in use (mixed: as declared), ascending
  bool mixed = false;         // `bits: "mixed"`
  std::string bits_source;    // "bits" | "trellis_bits_by_layer" | "<file>:<field>" | "tensors"
  std::string label;          // what errors name: the config.json path or the checkpoint
  ExpertNaming naming;        // plain layouts: as the checkpoint names its experts

  bool rank_sliced() const { return rotation != RotationLayout::kPlain; }
  bool has_layer(int layer) const;
  // K of each expert of `layer`; throws exl3::Error naming the label when not a MoE layer.
  const std::vector<int>& bits_of(int layer) const;
};

// Tier signature of a list of per-expert K: ascending (K, number of experts) pairs, the
// ((3,148),(4,108)) style the mixed-tier planners key on.
std::vector<std::pair<int, int>> tier_signature(const std::vector<int>& expert_bits);
std::string format_tier_signature(const std::vector<std::pair<int, int>>& signature);

// Validates the `hybrid_tr3_tail` block of a parsed config.json. nullopt when the block is
// absent. `config_dir` is where a `bits_per_expert: "file.json:field"` file is read from;
// `label` names config.json in errors. Throws exl3::Error on every fail-closed condition of
// docs/moe-layouts.md (What fails closed: Metadata).
std::optional<MoeLayout> parse_hybrid_tr3_tail(const nlohmann::json& config,
                                               const std::filesystem::path& config_dir,
                                               const std::string& label);

// The same from `<dir>/config.json` without opening any tensor (nullopt without the block).
std::optional<MoeLayout> read_hybrid_tr3_tail(const std::filesystem::path& checkpoint_dir);

// The MoE layout of an opened checkpoint: rank-sliced from config.json's hybrid_tr3_tail, else
// plain from the discovered `model.layers.{L}.mlp.experts.{E}.{proj}` linears (or Mixtral's
// `block_sparse_moe.experts.{E}.{w1,w3,w2}`; a checkpoint with both is refused); nullopt when the
// checkpoint has neither.
std::optional<MoeLayout> read_moe_layout(const Checkpoint& ckpt);

// Refuses (naming `label`, the model's config.json) a plain layout whose experts are named other
// than the model family names them (`block`, `proj`: gate, up, down), e.g. Mixtral's
// block_sparse_moe.experts.E.w1 under a Qwen3-MoE config.
void check_expert_naming(const MoeLayout& layout, std::string_view block,
                         const std::array<std::string, 3>& proj, const std::string& label);

}  // namespace exl3::moe
