// KimiLinearForCausalLM (Kimi-Linear), as transformers computes it: a hybrid whose layer_types name
// each layer linear_attention (Kimi delta attention, GatedDeltaNetSpec::kimi, under self_attn) or
// full_attention (DeepSeek-V3's multi-head latent attention without any RoPE: the key's "rope"
// part is shared by the heads but never rotated; a plain q_proj or a q LoRA); without layer_types
// every 4th layer from layer 4 (0-based index 4, 8, ...) is full. MLPs live under
// block_sparse_moe: SwiGLU of intermediate_size where mlp_layer_types says dense (default: the
// first first_k_dense_replace, 1), else DeepSeek-V3's MoE: a sigmoid router with
// e_score_correction_bias over n_group groups, routed_scaling_factor, experts w1 / w3 / w2, and
// shared experts. config.json may spell keys by KimiLinearConfig's aliases; the format layer
// reads both (exl3/format/checkpoint.hpp).
#include <fmt/format.h>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {
namespace {

// transformers' default when neither layer_types nor linear_attn_config lists them.
std::vector<std::string> layer_types(const Family& f) {
  std::vector<std::string> types;
  if (const nlohmann::json* lt = f.keys.get("layer_types")) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != f.num_layers) {
      fail("{}: key 'layer_types': expected a list of num_hidden_layers ({}) strings", f.label,
           f.num_layers);
    }
    for (size_t i = 0; i < lt->size(); ++i) {
      const auto& t = (*lt)[i];
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s != "linear_attention" && s != "full_attention") {
        fail("{}: key 'layer_types': entry {} ({}) is neither linear_attention nor full_attention",
             f.label, i, t.dump());
      }
      types.push_back(s);
    }
    return types;
  }
  for (int64_t i = 0; i < f.num_layers; ++i)
    types.emplace_back(i != 0 && i % 4 == 0 ? "full_attention" : "linear_attention");
  return types;
}

// The dense layers: mlp_layer_types' "dense" entries, else the first first_k_dense_replace.
std::set<int64_t> dense_layers_of(const Family& f) {
  std::set<int64_t> dense;
  if (const nlohmann::json* mt = f.keys.get("mlp_layer_types")) {
    if (!mt->is_array() || static_cast<int64_t>(mt->size()) != f.num_layers) {
      fail("{}: key 'mlp_layer_types': expected a list of num_hidden_layers ({}) strings", f.label,
           f.num_layers);
    }
    for (size_t i = 0; i < mt->size(); ++i) {
      const auto& t = (*mt)[i];
      if (t == "dense") {
        dense.insert(static_cast<int64_t>(i));
      } else if (t != "sparse") {
        fail("{}: key 'mlp_layer_types': entry {} ({}) is neither dense nor sparse", f.label, i,
             t.dump());
      }
    }
    return dense;
  }
  const int64_t first = f.keys.integer("first_k_dense_replace", 1);
  for (int64_t i = 0; i < std::min(first, f.num_layers); ++i) dense.insert(i);
  return dense;
}

}  // namespace

void describe_kimi_linear(Family& f) {
  const ConfigKeys& k = f.keys;
  // MLA without RoPE (transformers' KimiLinearAttention never rotates).
  MlaAttentionSpec mla;
  mla.num_heads = f.attention.num_heads;
  mla.q_lora_rank = k.has("q_lora_rank") ? k.integer("q_lora_rank") : 0;  // null: plain q_proj
  mla.kv_lora_rank = k.integer("kv_lora_rank");
  mla.qk_nope_head_dim = k.integer("qk_nope_head_dim");
  mla.qk_rope_head_dim = k.integer("qk_rope_head_dim");
  mla.v_head_dim = k.integer("v_head_dim");
  if (k.boolean("attention_bias", false)) {
    fail("{}: key 'attention_bias': biased MLA projections are not supported", f.label);
  }
  mla.rope = RopeSpec{};
  mla.rope.rotary_dim = 0;
  mla.scale = 1.0 / std::sqrt(static_cast<double>(mla.qk_head_dim()));

  MoeSpec moe = grouped_sigmoid_moe(f, "Kimi-Linear");
  moe.block = "block_sparse_moe";
  moe.expert_proj = {"w1", "w3", "w2"};
  moe_layers(f, moe, dense_layers_of(f));

  GatedDeltaNetSpec kda;
  kda.kimi = true;
  kda.num_k_heads = kda.num_v_heads = k.integer("linear_num_heads", 32);
  kda.head_k_dim = kda.head_v_dim = k.integer("linear_head_dim", 128);
  kda.conv_kernel = k.integer("linear_conv_kernel_dim", 4);
  kda.norm_eps = f.spec.rms_norm_eps;
  if (kda.num_k_heads < 1 || kda.head_k_dim < 1 || kda.conv_kernel < 1) {
    fail("{}: linear_num_heads, linear_head_dim and linear_conv_kernel_dim must be >= 1", f.label);
  }
  const std::vector<std::string> types = layer_types(f);
  for (auto& layer : f.spec.layers) {
    const std::string block = layer.prefix + ".block_sparse_moe";
    if (auto* m = std::get_if<MoeSpec>(&layer.mlp); m != nullptr && m->shared) {
      m->shared->prefix = block + ".shared_experts";
    } else if (auto* d = std::get_if<DenseMlpSpec>(&layer.mlp)) {
      d->prefix = block;
    }
    if (types[static_cast<size_t>(layer.index)] == "full_attention") {
      MlaAttentionSpec a = mla;
      a.prefix = layer.prefix + ".self_attn";
      layer.attention = a;
    } else {
      GatedDeltaNetSpec a = kda;
      a.prefix = layer.prefix + ".self_attn";
      layer.attention = a;
    }
  }
}

}  // namespace exl3::model::families
