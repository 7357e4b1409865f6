// Gemma3ForCausalLM (Gemma 3 text), read as transformers' Gemma3TextConfig reads config.json:
//   layers     `layer_types` (sliding_attention / full_attention), or when absent every
//              sliding_window_pattern-th layer (default 6) full and the rest sliding
//   attention  per-head q_norm / k_norm, softmax scale query_pre_attn_scalar^-0.5 (default 256),
//              attn_logit_softcapping unused (as in transformers); sliding layers see the last
//              sliding_window positions (default 4096) and rotate with rope_local_base_freq
//              (default 1e4, plain RoPE), full layers with rope_theta (default 1e6) and
//              rope_scaling; transformers 5 writes both as rope_parameters.{sliding,full}_attention
//   norms      Gemma's RMSNorm (x * (1 + w)); sandwich norms: post_attention_layernorm on the
//              attention output and post_feedforward_layernorm on the MLP output before their
//              residual adds, pre_feedforward_layernorm before the MLP
//   MLP        GeGLU with hidden_activation (gelu_pytorch_tanh)
//   embedding  scaled by sqrt(hidden_size); the head is tied unless the checkpoint has lm_head;
//              final_logit_softcapping caps the logits
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {
namespace {

using nlohmann::json;

// True per layer where the layer is sliding_attention: layer_types, else every
// sliding_window_pattern-th layer full.
std::vector<bool> gemma3_sliding_layers(const Family& f) {
  if (auto sliding = sliding_layer_types(f)) return *sliding;
  std::vector<bool> sliding;
  const int64_t pattern = f.keys.integer("sliding_window_pattern", 6);
  for (int64_t l = 0; l < f.num_layers; ++l) sliding.push_back((l + 1) % pattern != 0);
  return sliding;
}

// The RoPE of one layer type, as Gemma3TextConfig.convert_rope_params_to_dict builds it:
// rope_parameters[type] when given (else default), rope_scaling merged into the full layers'
// entry, and the theta keys as fallbacks.
RopeSpec layer_rope(const Family& f, const char* type, const char* theta_key, double theta,
                    int64_t head_dim) {
  json p = {{"rope_type", "default"}};
  if (const json* all = f.keys.get("rope_parameters")) {
    if (!all->is_object()) fail("{}: key 'rope_parameters': expected an object", f.label);
    if (const auto it = all->find(type); it != all->end() && !it->is_null()) {
      if (!it->is_object()) fail("{}: key 'rope_parameters.{}': expected an object", f.label, type);
      p = *it;
    }
  }
  if (std::string(type) == "full_attention") {
    if (const json* scaling = f.keys.get("rope_scaling")) {
      if (!scaling->is_object()) fail("{}: key 'rope_scaling': expected an object", f.label);
      p.update(*scaling);
    }
  }
  // Gemma rotates whole heads: its default RoPE ignores partial_rotary_factor.
  p.erase("partial_rotary_factor");
  return rope_from_parameters(f, std::move(p), theta_key, theta, head_dim);
}

}  // namespace

void describe_gemma3(Family& f) {
  if (f.keys.boolean("use_bidirectional_attention", false)) {
    fail("{}: key 'use_bidirectional_attention': only causal attention is supported", f.label);
  }
  const std::string act = f.keys.string("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh") {
    fail("{}: key 'hidden_activation': '{}' is not supported (Gemma's GeGLU: gelu_pytorch_tanh)",
         f.label, act);
  }
  const std::vector<bool> sliding = gemma3_sliding_layers(f);
  int64_t window = 0;
  if (std::find(sliding.begin(), sliding.end(), true) != sliding.end()) {
    // An explicit null leaves transformers without a window for its sliding layers' mask.
    if (const auto it = f.config.raw.find("sliding_window");
        it != f.config.raw.end() && it->is_null()) {
      fail("{}: key 'sliding_window' is null, but the model has sliding_attention layers", f.label);
    }
    window = f.keys.integer("sliding_window", 4096);
  }

  GqaAttentionSpec& a = f.attention;
  a.qk_norm = QkNorm::kPerHead;
  a.scale = 1.0 / std::sqrt(f.keys.number("query_pre_attn_scalar", 256.0));
  // attn_logit_softcapping is read and ignored: transformers' Gemma3Attention (unlike Gemma 2's)
  // never passes it to the attention function, and the released configs leave it null.
  const RopeSpec local =
      layer_rope(f, "sliding_attention", "rope_local_base_freq", 1e4, a.head_dim);
  const RopeSpec global = layer_rope(f, "full_attention", "rope_theta", 1e6, a.head_dim);

  ModelSpec& s = f.spec;
  s.norm_unit_offset = true;
  s.scale_embedding = true;
  s.final_logit_softcapping =
      f.keys.has("final_logit_softcapping") ? f.keys.number("final_logit_softcapping") : 0.0;
  dense_layers(f);
  for (auto& layer : s.layers) {
    const bool slide = sliding[static_cast<size_t>(layer.index)];
    auto& attn = std::get<GqaAttentionSpec>(layer.attention);
    attn.sliding_window = slide ? window : 0;
    attn.rope = slide ? local : global;
    layer.post_attention_norm = layer.prefix + ".pre_feedforward_layernorm.weight";
    layer.attention_output_norm = layer.prefix + ".post_attention_layernorm.weight";
    layer.mlp_output_norm = layer.prefix + ".post_feedforward_layernorm.weight";
    std::get<DenseMlpSpec>(layer.mlp).activation = Activation::kGeluTanh;
  }
}

}  // namespace exl3::model::families
