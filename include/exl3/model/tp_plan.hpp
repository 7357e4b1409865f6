// Tensor-parallel slicing rules: which part of every weight each of `tp` ranks holds. A pure plan
// over a ModelSpec and what the checkpoint stores (which linears are EXL3, whether the experts are
// rank-sliced); no weight is touched. Backends (the CPU TP engine, an NCCL one) build their
// per-rank modules from it.
//
//   column-parallel  q/k/v, gate/up, lm_head: output features split, no communication
//   row-parallel     o_proj, down_proj: input features split, partial sums all-reduced; the bias
//                    is added by rank 0 only
//   attention        heads padded to ceil(H / tp) * tp (96 heads at TP 9 -> 99); rank r owns
//                    padded heads [r * H_loc, (r + 1) * H_loc), of which those >= H are padding
//                    (no weights, no work); a rank holds the kv heads its q heads read, so kv
//                    heads are replicated when TP exceeds them; an EXL3 k/v projection is computed
//                    over the whole 128-channel blocks covering those heads (replicating a
//                    neighbour's kv head when head_dim < 128) rather than cut
//   MLP / experts    the intermediate axis dealt as evenly as possible (the first ranks get the
//                    remainder)
//   vocabulary       embedding rows and lm_head outputs dealt the same way; the embedding lookup
//                    is all-reduced, the logits all-gathered
//
// EXL3 linears are cut only between whole 128-channel blocks (the Hadamard-128 rotations and the
// 16x16 tiles cannot be split): dealt axes move in blocks; a head split that would cut a block
// fails with an error that names the linear and lists the TP sizes that work. Unquantized linears
// split anywhere that keeps heads whole. Rank-sliced checkpoints (hybrid_tr3_tail) fix the expert
// split: runtime TP must equal the checkpoint's.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/model/spec.hpp"

namespace exl3 {
class Checkpoint;
}

namespace exl3::model {

inline constexpr int64_t kTpBlock = 128;  // EXL3 slices are whole Hadamard-128 blocks
inline constexpr int kMaxTp = 64;

// [begin, begin + count) along one axis (channels, heads or vocabulary rows).
struct Extent {
  int64_t begin = 0;
  int64_t count = 0;

  int64_t end() const { return begin + count; }
  bool empty() const { return count == 0; }
  bool operator==(const Extent&) const = default;
};

enum class TpSplit : uint8_t {
  kColumn,  // output features split
  kRow,     // input features split, partial sums all-reduced
};
std::string_view tp_split_name(TpSplit s);  // "column" | "row"

struct TpLinearPlan {
  std::string prefix;
  TpSplit split = TpSplit::kColumn;
  bool exl3 = false;
  int64_t in = 0, out = 0;    // full features (config.json)
  std::vector<Extent> ranks;  // per rank, along `out` (column) or `in` (row)
};

struct TpAttentionPlan {
  int64_t num_heads = 0;
  int64_t padded_heads = 0;  // ceil(num_heads / tp) * tp
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t kv_replicas = 1;       // most ranks holding one kv head (> 1: replicated)
  std::vector<Extent> q_heads;   // real q heads of each rank
  std::vector<Extent> kv_heads;  // kv heads each rank holds
  // q/o extents are the q heads' channels; k/v extents cover the kv heads' channels (whole
  // 128-channel blocks for EXL3, so they may include a neighbouring kv head).
  TpLinearPlan q, k, v, o;
};

struct TpMlpPlan {  // SwiGLU: gate/up column-parallel, down row-parallel over the same extents
  std::string prefix;
  int64_t intermediate = 0;
  bool exl3 = false;
  std::vector<Extent> ranks;    // intermediate channels of each rank
  TpLinearPlan gate, up, down;  // over `ranks`: column, column, row
};

struct TpMoePlan {
  std::string prefix;
  int64_t num_experts = 0;
  int64_t intermediate = 0;
  bool rank_sliced = false;   // each rank's expert slices are stored (`.rank{r}` tensors)
  std::vector<Extent> ranks;  // intermediate channels of every routed expert on each rank
  std::optional<TpMlpPlan> shared;
};

// MLA: the heads dealt as evenly as possible (every rank at least one); the latent path (q_a, kv_a,
// their norms, a DSA indexer and the latent cache) is replicated, every rank computing it whole.
struct TpMlaPlan {
  std::vector<Extent> heads;
  TpLinearPlan q;     // q_b_proj (or q_proj): column, heads x qk_head_dim
  TpLinearPlan kv_b;  // column, heads x (qk_nope_head_dim + v_head_dim)
  TpLinearPlan o;     // row, heads x v_head_dim
};

struct TpLayerPlan {
  int index = 0;
  TpAttentionPlan attention;     // GQA layers
  std::optional<TpMlaPlan> mla;  // MLA layers
  std::variant<TpMlpPlan, TpMoePlan> mlp;
};

struct TpPlan {
  int tp = 1;
  int64_t vocab_size = 0;
  std::vector<Extent> vocab;  // embedding rows / lm_head outputs of each rank
  TpLinearPlan lm_head;       // column-parallel over `vocab` (exl3 false when tied)
  std::vector<TpLayerPlan> layers;
};

// What the plan needs to know about the stored weights.
struct TpWeightInfo {
  std::set<std::string> exl3;  // prefixes of the EXL3 linears
  int checkpoint_tp = 1;       // > 1: experts stored rank-sliced for this TP
  bool exl3_experts = true;  // false: routed experts are unquantized (cut anywhere, not in blocks)
};
TpWeightInfo tp_weight_info(const Checkpoint& ckpt);

// The plan for `tp` ranks (tp == 1 is the trivial plan). Throws exl3::Error naming the linear or
// checkpoint at fault and listing the TP sizes that work for this model.
TpPlan plan_tensor_parallel(const ModelSpec& spec, int tp, const TpWeightInfo& weights);
// Every TP in 1..max_tp that plan_tensor_parallel accepts.
std::vector<int> working_tp_sizes(const ModelSpec& spec, const TpWeightInfo& weights,
                                  int max_tp = kMaxTp);

// `count` units dealt to `tp` ranks in whole blocks of `block` (the last block may be short):
// rank r gets q or q + 1 blocks (the first count_blocks % tp ranks the extra one).
std::vector<Extent> deal_extents(int64_t count, int tp, int64_t block);

// Per rank: heads, kv heads, channels and vocabulary rows (for --json and logs).
nlohmann::json tp_plan_summary(const TpPlan& plan);

}  // namespace exl3::model
