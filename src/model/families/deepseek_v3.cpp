// DeepseekV3ForCausalLM (DeepSeek-V3 / R1, and Kimi-K2's text model, which transformers maps to
// it): multi-head latent attention with a q LoRA (q_lora_rank) or a plain q_proj, the latent
// kv_lora_rank and a decoupled RoPE part of qk_rope_head_dim (interleaved pairs when
// rope_interleave, transformers' default), DeepSeek's yarn (its mscale_all_dim also scales the
// softmax), and GLM-4.5's MoE: a sigmoid router with e_score_correction_bias choosing the best
// topk_group of n_group groups (noaux_tc), routed_scaling_factor, n_shared_experts, the first
// first_k_dense_replace layers dense. Its MTP layers (num_nextn_predict_layers) are described by
// describe_mtp, and loaded only to draft with (runtime/mtp).
#include <cmath>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {
namespace {

// transformers' yarn_get_mscale.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// The softmax scale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 when the RoPE is
// scaled and names mscale_all_dim (transformers' yarn_apply_mscale).
double mla_scale(const ConfigKeys& k, int64_t qk_head_dim) {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  const nlohmann::json* p = k.get("rope_parameters");
  if (p == nullptr) p = k.get("rope_scaling");
  if (p == nullptr || !p->is_object()) return scale;
  const std::string type = p->value("rope_type", p->value("type", std::string("default")));
  if (type == "default") return scale;
  const double all_dim = p->contains("mscale_all_dim") && (*p)["mscale_all_dim"].is_number()
                             ? (*p)["mscale_all_dim"].get<double>()
                             : 0.0;
  if (all_dim != 0.0) {
    const double m = yarn_mscale((*p).value("factor", 1.0), all_dim);
    scale *= m * m;
  }
  return scale;
}

}  // namespace

MlaAttentionSpec deepseek_mla(const Family& f, bool rope_interleave) {
  const ConfigKeys& k = f.keys;
  MlaAttentionSpec a;
  a.num_heads = f.attention.num_heads;
  if (f.attention.num_kv_heads != a.num_heads) {
    fail(
        "{}: key 'num_key_value_heads': {} differs from num_attention_heads {}; MLA has no kv "
        "head groups",
        f.label, f.attention.num_kv_heads, a.num_heads);
  }
  a.q_lora_rank = k.has("q_lora_rank") ? k.integer("q_lora_rank") : 0;  // null: plain q_proj
  a.kv_lora_rank = k.integer("kv_lora_rank");
  a.qk_nope_head_dim = k.integer("qk_nope_head_dim");
  a.qk_rope_head_dim = k.integer("qk_rope_head_dim");
  a.v_head_dim = k.integer("v_head_dim");
  if (k.boolean("attention_bias", false)) {
    fail("{}: key 'attention_bias': biased MLA projections are not supported", f.label);
  }
  a.rope_interleave = rope_interleave;
  a.rope = parse_rope(f.config.raw, a.qk_rope_head_dim, f.label);
  if (a.rope.rotary_dim != a.qk_rope_head_dim) {
    fail("{}: RoPE covers {} of the {} qk_rope_head_dim channels; MLA rotates all of them", f.label,
         a.rope.rotary_dim, a.qk_rope_head_dim);
  }
  a.scale = mla_scale(k, a.qk_head_dim());
  return a;
}

MoeSpec grouped_sigmoid_moe(const Family& f, std::string_view family) {
  const ConfigKeys& k = f.keys;
  MoeSpec moe = routed_experts(f, f.config.num_experts, "n_routed_experts");
  moe.router = RouterKind::kSigmoidGrouped;
  moe.renormalize = k.boolean("norm_topk_prob", true);
  moe.n_group = static_cast<int>(k.integer("n_group", 1));
  moe.topk_group = static_cast<int>(k.integer("topk_group", 1));
  if (moe.n_group <= 0 || moe.num_experts % moe.n_group != 0) {
    fail("{}: key 'n_group': {} does not divide the {} routed experts", f.label, moe.n_group,
         moe.num_experts);
  }
  if (moe.topk_group <= 0 || moe.topk_group > moe.n_group) {
    fail("{}: key 'topk_group': {} is outside 1..n_group ({})", f.label, moe.topk_group,
         moe.n_group);
  }
  if (moe.num_experts / moe.n_group < 2) {
    fail("{}: key 'n_group': groups of {} expert(s); the group score sums each group's top 2",
         f.label, moe.num_experts / moe.n_group);
  }
  if (moe.top_k > moe.topk_group * (moe.num_experts / moe.n_group)) {
    fail("{}: key 'num_experts_per_tok': {} is more than the {} experts of topk_group {} groups",
         f.label, moe.top_k, moe.topk_group * (moe.num_experts / moe.n_group), moe.topk_group);
  }
  moe.routed_scaling_factor = k.number("routed_scaling_factor", 1.0);
  moe.correction_bias = true;
  const std::string method = k.string("topk_method", "noaux_tc");
  if (method != "noaux_tc") {
    fail("{}: key 'topk_method': '{}' is not supported ({} routing is noaux_tc)", f.label, method,
         family);
  }
  const std::string scoring = k.string("scoring_func", "sigmoid");
  if (scoring != "sigmoid") {
    fail("{}: key 'scoring_func': '{}' is not supported ({} scores with sigmoid)", f.label, scoring,
         family);
  }
  const int64_t shared = k.integer("n_shared_experts", 1);
  if (shared > 0) moe.shared = DenseMlpSpec{"", moe.intermediate * shared};
  return moe;
}

void describe_deepseek_v3(Family& f) {
  const ConfigKeys& k = f.keys;
  f.mla = deepseek_mla(f, k.boolean("rope_interleave", true));  // DeepseekV3Config's default
  const MoeSpec moe = grouped_sigmoid_moe(f, "DeepSeek-V3");
  if (k.integer("moe_layer_freq", 1) != 1) {
    fail("{}: key 'moe_layer_freq': only 1 (every layer after first_k_dense_replace) is supported",
         f.label);
  }
  moe_layers(f, moe, first_dense_layers(f));
}

}  // namespace exl3::model::families
