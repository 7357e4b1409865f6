// GptOssForCausalLM, read as transformers' GptOssConfig reads config.json:
//   layers     `layer_types` (sliding_attention / full_attention), or when absent sliding on even
//              layers and full on odd ones; sliding layers see the last sliding_window positions
//   attention  GQA with biases on q/k/v/o (from the checkpoint), a learned sink logit per head
//              (`self_attn.sinks`) in every softmax's denominator, head_dim^-0.5, one RoPE
//              (rope_parameters, YaRN in the released models) for every layer
//   MoE        every layer: the router `mlp.router` (weight and bias) picks the top
//              num_experts_per_tok logits and softmaxes them; num_local_experts experts of
//              intermediate_size with biases and the clamped SwiGLU (swiglu_alpha, default 1.702,
//              and swiglu_limit, default 7)
// The attention and MLP layouts are those of the checkpoint: transformers' fused experts or a
// converted model's per-expert linears (see MoeSpec).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {
namespace {

using nlohmann::json;

std::vector<bool> gpt_oss_sliding_layers(const Family& f) {
  if (auto sliding = sliding_layer_types(f)) return *sliding;
  std::vector<bool> sliding;  // GptOssConfig's default: sliding, full, sliding, ...
  for (int64_t l = 0; l < f.num_layers; ++l) sliding.push_back(l % 2 == 0);
  return sliding;
}

// GptOssConfig's RoPE: rope_parameters, else the legacy rope_scaling (which the released
// config.json files use and transformers 5 reads as rope_parameters), else YaRN with factor 32
// over 4096 original positions (beta_fast 32, beta_slow 1, no truncation); rope_theta defaults to
// 150000.
RopeSpec gpt_oss_rope(const Family& f, int64_t head_dim) {
  json p = {{"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
            {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const json* given = f.keys.get(key);
    if (given == nullptr || given->is_null()) continue;
    if (!given->is_object()) fail("{}: key '{}': expected an object", f.label, key);
    p = *given;
    break;
  }
  return rope_from_parameters(f, std::move(p), "rope_theta", 150000.0, head_dim);
}

}  // namespace

void describe_gpt_oss(Family& f) {
  const std::vector<bool> sliding = gpt_oss_sliding_layers(f);
  int64_t window = 0;
  if (std::find(sliding.begin(), sliding.end(), true) != sliding.end()) {
    if (const auto it = f.config.raw.find("sliding_window");
        it != f.config.raw.end() && it->is_null()) {
      fail("{}: key 'sliding_window' is null, but the model has sliding_attention layers", f.label);
    }
    window = f.keys.integer("sliding_window", 128);
    if (window <= 0) fail("{}: key 'sliding_window': {} must be positive", f.label, window);
  }
  f.attention.sinks = true;
  f.attention.rope = gpt_oss_rope(f, f.attention.head_dim);

  MoeSpec moe = routed_experts(f, f.config.num_experts, "num_local_experts", "intermediate_size");
  // GptOssTopKRouter softmaxes the k best logits: the same weights as a softmax over every
  // expert renormalised over the k.
  moe.router = RouterKind::kSoftmax;
  moe.renormalize = true;
  moe.router_name = "router";
  moe.router_bias = true;
  moe.expert_bias = true;
  moe.activation = Activation::kClampedSwiglu;
  moe.swiglu_alpha = f.keys.number("swiglu_alpha", 1.702);
  moe.swiglu_limit = f.keys.number("swiglu_limit", 7.0);
  if (!(moe.swiglu_limit > 0.0)) {
    fail("{}: key 'swiglu_limit': {} must be positive", f.label, moe.swiglu_limit);
  }
  moe_layers(f, moe, {});
  for (auto& layer : f.spec.layers) {
    auto& attn = std::get<GqaAttentionSpec>(layer.attention);
    attn.sliding_window = sliding[static_cast<size_t>(layer.index)] ? window : 0;
  }
}

}  // namespace exl3::model::families
