// Glm4MoeForCausalLM (GLM-4.5): partial rotary (partial_rotary_factor, read with RoPE), an
// optional q/k norm (use_qk_norm), a sigmoid router with e_score_correction_bias choosing the
// best topk_group of n_group groups (noaux_tc), routed_scaling_factor, n_shared_experts added to
// the routed sum, and the first first_k_dense_replace layers dense. MTP layers are not loaded.
#include <algorithm>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_glm4_moe(Family& f) {
  const ConfigKeys& k = f.keys;
  f.attention.qk_norm = k.boolean("use_qk_norm", false);
  MoeSpec moe = routed_experts(f, f.config.num_experts, "n_routed_experts");
  moe.router = RouterKind::kSigmoidGrouped;
  moe.renormalize = k.boolean("norm_topk_prob", true);
  moe.n_group = static_cast<int>(k.integer("n_group", 1));
  moe.topk_group = static_cast<int>(k.integer("topk_group", 1));
  if (moe.n_group == 0 || moe.num_experts % moe.n_group != 0) {
    fail("{}: key 'n_group': {} does not divide the {} routed experts", f.label, moe.n_group,
         moe.num_experts);
  }
  if (moe.topk_group == 0 || moe.topk_group > moe.n_group) {
    fail("{}: key 'topk_group': {} is outside 1..n_group ({})", f.label, moe.topk_group,
         moe.n_group);
  }
  if (moe.top_k > moe.topk_group * (moe.num_experts / moe.n_group)) {
    fail("{}: key 'num_experts_per_tok': {} is more than the {} experts of topk_group {} groups",
         f.label, moe.top_k, moe.topk_group * (moe.num_experts / moe.n_group), moe.topk_group);
  }
  moe.routed_scaling_factor = k.number("routed_scaling_factor", 1.0);
  moe.correction_bias = true;
  const std::string method = k.string("topk_method", "noaux_tc");
  if (method != "noaux_tc") {
    fail("{}: key 'topk_method': '{}' is not supported (GLM-4.5 routing is noaux_tc)", f.label,
         method);
  }
  const int64_t shared = k.integer("n_shared_experts", 1);
  if (shared > 0) moe.shared = DenseMlpSpec{"", moe.intermediate * shared};
  std::set<int64_t> dense;
  const int64_t first_dense = k.integer("first_k_dense_replace", 1);
  for (int64_t l = 0; l < std::min(first_dense, f.num_layers); ++l) dense.insert(l);
  moe_layers(f, moe, dense);
}

}  // namespace exl3::model::families
