// MiniMaxM2ForCausalLM (MiniMax-M2 and its point releases), as transformers computes it: Mixtral's
// layer (no sliding window) with
// - q_norm / k_norm over each token's whole q and k projection, every head at once;
// - RoPE on the first rotary_dim channels of each head (partial_rotary_factor);
// - in every layer a sigmoid router: sigmoid(logits) + block_sparse_moe.e_score_correction_bias
//   chooses the top k experts, their unbiased sigmoid scores renormalised to sum to 1 weight
//   them (no groups, no scaling factor, no shared expert); experts w1 = gate, w3 = up, w2 = down.
// The release's config also carries the original code's keys (rotary_dim, qk_norm_type,
// scoring_func, use_routing_bias, attn_type_list): where one says something transformers would
// not compute, the config is refused rather than guessed at. MTP modules are not loaded.
#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_minimax_m2(Family& f) {
  const ConfigKeys& k = f.keys;
  GqaAttentionSpec& a = f.attention;
  a.qk_norm = QkNorm::kAcrossHeads;
  if (k.has("rotary_dim") && k.integer("rotary_dim") != a.rope.rotary_dim) {
    fail(
        "{}: key 'rotary_dim' is {}, but partial_rotary_factor gives {} of head_dim {} (what "
        "transformers rotates); hint: set rope_parameters.partial_rotary_factor to rotary_dim / "
        "head_dim, as MiniMax's transformers-format config does",
        f.label, k.integer("rotary_dim"), a.rope.rotary_dim, a.head_dim);
  }
  if (!k.boolean("use_qk_norm", true)) {
    fail("{}: key 'use_qk_norm' is false; MiniMax-M2 models always normalise q and k", f.label);
  }
  if (const std::string t = k.string("qk_norm_type", "per_layer"); t != "per_layer") {
    fail("{}: key 'qk_norm_type': '{}' is not supported (MiniMax-M2 norms q and k per_layer)",
         f.label, t);
  }
  if (const std::string s = k.string("scoring_func", "sigmoid"); s != "sigmoid") {
    fail("{}: key 'scoring_func': '{}' is not supported (MiniMax-M2 scores with sigmoid)", f.label,
         s);
  }
  if (!k.boolean("use_routing_bias", true)) {
    fail("{}: key 'use_routing_bias' is false; MiniMax-M2's router always adds its bias", f.label);
  }
  if (const nlohmann::json* types = k.get("attn_type_list")) {
    for (const auto& t : *types) {
      if (!t.is_number_integer() || t.get<int64_t>() != 1) {
        fail(
            "{}: key 'attn_type_list': entry {} is not supported (only 1, full softmax "
            "attention; MiniMax-01's linear attention layers are another architecture)",
            f.label, t.dump());
      }
    }
  }
  if (k.integer("shared_intermediate_size", 0) != 0) {
    fail("{}: key 'shared_intermediate_size': MiniMax-M2 has no shared expert", f.label);
  }
  MoeSpec moe = routed_experts(f, f.config.num_experts, "num_local_experts", "intermediate_size");
  moe.router = RouterKind::kSigmoidGrouped;  // one group: a plain top-k over the biased scores
  moe.renormalize = true;
  moe.correction_bias = true;
  moe.correction_bias_name = "e_score_correction_bias";
  moe.block = "block_sparse_moe";
  moe.expert_proj = {"w1", "w3", "w2"};
  moe_layers(f, moe, {});
}

}  // namespace exl3::model::families
