// Qwen3NextForCausalLM (Qwen3-Next), as transformers computes it: a hybrid stack whose
// layer_types name each layer linear_attention (gated DeltaNet, GatedDeltaNetSpec) or
// full_attention (Qwen3's attention with per-head q/k norms, partial rotary and the output gate
// from q_proj's second half per head); without layer_types every full_attention_interval-th layer
// (default 4) is full. Every RMSNorm scales by (1 + w) except the DeltaNet's gated norm. MLPs are
// Qwen3-MoE's (softmax top-k router, norm_topk_prob, mlp_only_layers, decoder_sparse_step) with a
// shared expert (`shared_expert`, shared_expert_intermediate_size) whose output is scaled by
// sigmoid(shared_expert_gate(x)). MTP weights of the release (`mtp.*`) are not loaded.
//
// Qwen3.5's text models (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM) are the same stack with the
// DeltaNet's inputs from four projections (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a). The
// dense one has SwiGLU MLPs of intermediate_size everywhere; the MoE one has the
// gated-shared-expert MoE in every layer, its top-k weights always renormalised (its config has no
// norm_topk_prob, decoder_sparse_step or mlp_only_layers, and transformers ignores them if given).
// Their RoPE is Qwen3-VL's interleaved multimodal RoPE (mrope_section), which for text, where the
// three position components are equal, is plain RoPE over the rotary part.
#include <fmt/format.h>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {
namespace {

// transformers' layer_types for the model: the key's list, else the interval pattern.
std::vector<bool> linear_layers(const Family& f) {
  const ConfigKeys& k = f.keys;
  std::vector<bool> linear(static_cast<size_t>(f.num_layers));
  if (const nlohmann::json* lt = k.get("layer_types")) {
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
      linear[i] = s == "linear_attention";
    }
    return linear;
  }
  const int64_t interval = k.integer("full_attention_interval", 4);
  if (interval < 1)
    fail("{}: key 'full_attention_interval' is {}; expected >= 1", f.label, interval);
  for (int64_t l = 0; l < f.num_layers; ++l)
    linear[static_cast<size_t>(l)] = (l + 1) % interval != 0;
  return linear;
}

GatedDeltaNetSpec delta_net(const Family& f, bool split_inputs) {
  const ConfigKeys& k = f.keys;
  GatedDeltaNetSpec d;
  d.num_k_heads = k.integer("linear_num_key_heads", 16);
  d.num_v_heads = k.integer("linear_num_value_heads", 32);
  d.head_k_dim = k.integer("linear_key_head_dim", 128);
  d.head_v_dim = k.integer("linear_value_head_dim", 128);
  d.conv_kernel = k.integer("linear_conv_kernel_dim", 4);
  d.norm_eps = f.spec.rms_norm_eps;
  d.split_inputs = split_inputs;
  if (d.num_k_heads < 1 || d.num_v_heads < 1 || d.num_v_heads % d.num_k_heads != 0) {
    fail(
        "{}: key 'linear_num_value_heads': {} is not a multiple of linear_num_key_heads {} (each "
        "key head serves a whole number of value heads)",
        f.label, d.num_v_heads, d.num_k_heads);
  }
  if (d.head_k_dim < 1 || d.head_v_dim < 1 || d.conv_kernel < 1) {
    fail("{}: linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim must be >= 1",
         f.label);
  }
  return d;
}

// Every layer's token mixer from layer_types: a DeltaNet, or the gated attention already there.
void mix_layers(Family& f, bool split_inputs) {
  const std::vector<bool> linear = linear_layers(f);
  const GatedDeltaNetSpec d = delta_net(f, split_inputs);
  for (auto& layer : f.spec.layers) {
    if (auto* m = std::get_if<MoeSpec>(&layer.mlp); m != nullptr && m->shared)
      m->shared->prefix = m->prefix + ".shared_expert";
    if (!linear[static_cast<size_t>(layer.index)]) continue;
    GatedDeltaNetSpec a = d;
    a.prefix = layer.prefix + ".linear_attn";
    layer.attention = a;
  }
}

// The routed experts and the sigmoid-gated shared expert, with the router's renormalisation.
MoeSpec gated_shared_moe(const Family& f, bool renormalize) {
  MoeSpec moe = routed_experts(f, f.config.num_experts, "num_experts");
  moe.router = RouterKind::kSoftmax;
  moe.renormalize = renormalize;
  if (const int64_t shared = f.keys.integer("shared_expert_intermediate_size", 512); shared > 0) {
    moe.shared = DenseMlpSpec{"", shared};
    moe.shared_gate = "shared_expert_gate";
  }
  return moe;
}

void gated_attention(Family& f) {
  f.spec.norm_unit_offset = true;
  f.attention.qk_norm = QkNorm::kPerHead;
  f.attention.output_gate = true;
}

}  // namespace

void describe_qwen3_next(Family& f) {
  const ConfigKeys& k = f.keys;
  gated_attention(f);
  const MoeSpec moe = gated_shared_moe(f, k.boolean("norm_topk_prob", true));
  const int64_t step = k.integer("decoder_sparse_step", 1);
  if (step < 1) fail("{}: key 'decoder_sparse_step' is {}; expected >= 1", f.label, step);
  std::set<int64_t> dense;
  for (const int64_t l : k.int_list("mlp_only_layers")) {
    if (l < 0 || l >= f.num_layers) {
      fail("{}: key 'mlp_only_layers': layer {} is outside 0..{}", f.label, l, f.num_layers - 1);
    }
    dense.insert(l);
  }
  for (int64_t l = 0; l < f.num_layers; ++l)
    if ((l + 1) % step != 0) dense.insert(l);
  moe_layers(f, moe, dense);
  mix_layers(f, false);
}

void describe_qwen3_5(Family& f, bool moe) {
  gated_attention(f);
  if (moe) {
    moe_layers(f, gated_shared_moe(f, true), {});
  } else {
    dense_layers(f);
  }
  mix_layers(f, true);
}

}  // namespace exl3::model::families
