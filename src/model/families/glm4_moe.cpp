// Glm4MoeForCausalLM (GLM-4.5): partial rotary (partial_rotary_factor, read with RoPE), an
// optional q/k norm (use_qk_norm), a sigmoid router with e_score_correction_bias choosing the
// best topk_group of n_group groups (noaux_tc), routed_scaling_factor, n_shared_experts added to
// the routed sum, and the first first_k_dense_replace layers dense. MTP layers are not loaded.
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_glm4_moe(Family& f) {
  const ConfigKeys& k = f.keys;
  f.attention.qk_norm = k.boolean("use_qk_norm", false) ? QkNorm::kPerHead : QkNorm::kNone;
  moe_layers(f, grouped_sigmoid_moe(f, "GLM-4.5"), first_dense_layers(f));
}

}  // namespace exl3::model::families
