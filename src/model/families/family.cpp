// The layer builders every family shares (see family.hpp).
#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "exl3/error.hpp"
#include "exl3/model/rope.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {

void dense_layers(Family& f) {
  moe_layers(f, MoeSpec{}, {});
}

void moe_layers(Family& f, const MoeSpec& moe, const std::set<int64_t>& dense) {
  const bool any_moe = moe.num_experts > 0;
  int64_t intermediate = 0;  // read only when some layer is dense
  for (int64_t l = 0; l < f.num_layers; ++l) {
    LayerSpec layer;
    layer.index = static_cast<int>(l);
    layer.prefix = fmt::format("model.layers.{}", l);
    layer.input_norm = layer.prefix + ".input_layernorm.weight";
    layer.post_attention_norm = layer.prefix + ".post_attention_layernorm.weight";
    if (f.mla) {
      MlaAttentionSpec a = *f.mla;
      a.prefix = layer.prefix + ".self_attn";
      layer.attention = a;
    } else {
      GqaAttentionSpec a = f.attention;
      a.prefix = layer.prefix + ".self_attn";
      layer.attention = a;
    }
    const std::string mlp_prefix = layer.prefix + ".mlp";
    if (any_moe && dense.count(l) == 0) {
      MoeSpec m = moe;
      m.prefix = layer.prefix + "." + moe.block;
      if (m.shared) m.shared->prefix = mlp_prefix + ".shared_experts";
      layer.mlp = m;
    } else {
      if (intermediate == 0) intermediate = f.keys.integer("intermediate_size");
      layer.mlp = DenseMlpSpec{mlp_prefix, intermediate};
    }
    f.spec.layers.push_back(std::move(layer));
  }
}

MoeSpec routed_experts(const Family& f, int64_t experts, const char* experts_key,
                       const char* intermediate_key) {
  MoeSpec moe;
  moe.num_experts = experts;
  if (moe.num_experts <= 0) fail("{}: key '{}' is missing or 0", f.label, experts_key);
  const int64_t top_k = f.keys.integer("num_experts_per_tok");
  if (top_k > moe.num_experts) {
    fail("{}: key 'num_experts_per_tok': {} is more than the {} experts", f.label, top_k,
         moe.num_experts);
  }
  moe.top_k = static_cast<int>(top_k);
  moe.intermediate = f.keys.integer(intermediate_key);
  return moe;
}

std::set<int64_t> first_dense_layers(const Family& f) {
  std::set<int64_t> dense;
  const int64_t first = f.keys.integer("first_k_dense_replace", 1);
  for (int64_t l = 0; l < std::min(first, f.num_layers); ++l) dense.insert(l);
  return dense;
}

std::optional<std::vector<bool>> sliding_layer_types(const Family& f) {
  const nlohmann::json* lt = f.keys.get("layer_types");
  if (lt == nullptr) return std::nullopt;
  if (!lt->is_array() || static_cast<int64_t>(lt->size()) != f.num_layers) {
    fail("{}: key 'layer_types': expected a list of {} strings (num_hidden_layers)", f.label,
         f.num_layers);
  }
  std::vector<bool> sliding;
  for (const auto& t : *lt) {
    const std::string s = t.is_string() ? t.get<std::string>() : "";
    if (s != "sliding_attention" && s != "full_attention") {
      fail("{}: key 'layer_types': entry {} is not sliding_attention or full_attention", f.label,
           t.dump());
    }
    sliding.push_back(s == "sliding_attention");
  }
  return sliding;
}

RopeSpec rope_from_parameters(const Family& f, nlohmann::json params, const char* theta_key,
                              double theta, int64_t head_dim) {
  if (!params.contains("rope_theta") || params["rope_theta"].is_null())
    params["rope_theta"] = f.keys.number(theta_key, theta);
  nlohmann::json cfg = {{"rope_parameters", std::move(params)}};
  if (f.spec.max_position_embeddings > 0)
    cfg["max_position_embeddings"] = f.spec.max_position_embeddings;
  return parse_rope(cfg, head_dim, f.label);
}

}  // namespace exl3::model::families
