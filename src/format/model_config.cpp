// parse_model_config: the parts of an HF config.json that exl3 uses, with type checks.
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/config_keys.hpp"

namespace exl3 {
namespace {

// KimiLinearConfig's attribute_map: config.json may name these keys either way (save_pretrained
// writes the aliases). Both spellings with different values are ambiguous and refused.
void canonical_kimi_linear_keys(nlohmann::json& j, const std::string& label) {
  static const std::pair<const char*, const char*> kAliases[] = {
      {"num_experts_per_token", "num_experts_per_tok"}, {"num_expert_group", "n_group"},
      {"num_shared_experts", "n_shared_experts"},       {"moe_renormalize", "norm_topk_prob"},
      {"model_max_length", "max_position_embeddings"},
  };
  for (const auto& [alias, key] : kAliases) {
    if (!j.contains(alias)) continue;
    if (j.contains(key) && j[key] != j[alias]) {
      fail("{}: keys '{}' ({}) and '{}' ({}) name one setting with different values", label, alias,
           j[alias].dump(), key, j[key].dump());
    }
    j[key] = j[alias];
  }
  // The released checkpoints' nested linear_attn_config (layers numbered from 1).
  const auto* lac = j.contains("linear_attn_config") ? &j["linear_attn_config"] : nullptr;
  if (lac == nullptr || lac->is_null()) return;
  if (!lac->is_object()) fail("{}: key 'linear_attn_config': expected an object", label);
  const std::pair<const char*, const char*> nested[] = {
      {"head_dim", "linear_head_dim"},
      {"num_heads", "linear_num_heads"},
      {"short_conv_kernel_size", "linear_conv_kernel_dim"}};
  for (const auto& [from, to] : nested)
    if (lac->contains(from)) j[to] = (*lac)[from];
  if (!j.contains("layer_types") && lac->contains("full_attn_layers") &&
      lac->contains("kda_layers") && j.contains("num_hidden_layers") &&
      j["num_hidden_layers"].is_number_integer()) {
    const auto n = j["num_hidden_layers"].get<int64_t>();
    nlohmann::json types(static_cast<size_t>(n), nullptr);
    for (const auto& [list, type] : {std::pair{"full_attn_layers", "full_attention"},
                                     std::pair{"kda_layers", "linear_attention"}}) {
      for (const auto& l : (*lac)[list]) {
        if (!l.is_number_integer() || l.get<int64_t>() < 1 || l.get<int64_t>() > n) {
          fail("{}: key 'linear_attn_config.{}': entry {} is not a layer 1..{}", label, list,
               l.dump(), n);
        }
        types[static_cast<size_t>(l.get<int64_t>() - 1)] = type;
      }
    }
    j["layer_types"] = types;
  }
}

}  // namespace

ModelConfig parse_model_config(std::string_view json_text, const std::string& label) {
  nlohmann::json j = parse_json_object(json_text, label);
  if (const auto* a = j.contains("architectures") ? &j["architectures"] : nullptr;
      a != nullptr && a->is_array() && !a->empty() && (*a)[0] == "KimiLinearForCausalLM") {
    canonical_kimi_linear_keys(j, label);
  }
  const ConfigKeys k(j, label);
  ModelConfig c;
  if (const auto* a = k.get("architectures")) {
    if (!a->is_array()) fail("{}: key 'architectures': expected an array of strings", label);
    if (!a->empty()) {
      if (!(*a)[0].is_string()) fail("{}: key 'architectures': entry 0 is not a string", label);
      c.architecture = (*a)[0].get<std::string>();
    }
  }
  c.model_type = k.string("model_type", "");
  // Absent sizes read as 0 here; the runtime's model description requires what it needs.
  c.hidden_size = k.integer("hidden_size", 0);
  c.intermediate_size = k.integer("intermediate_size", 0);
  c.num_hidden_layers = k.integer("num_hidden_layers", 0);
  c.num_attention_heads = k.integer("num_attention_heads", 0);
  c.num_key_value_heads = k.integer("num_key_value_heads", 0);
  c.head_dim = k.integer("head_dim", 0);
  c.vocab_size = k.integer("vocab_size", 0);
  // Model families spell the expert count differently; the first one present wins.
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (k.has(key)) {
      c.num_experts = k.integer(key, 0);
      break;
    }
  }
  c.num_experts_per_tok = k.integer("num_experts_per_tok", 0);
  c.moe_intermediate_size = k.integer("moe_intermediate_size", 0);
  c.n_shared_experts = k.integer("n_shared_experts", 0);
  if (const auto* e = k.get("rms_norm_eps")) {
    if (!e->is_number())
      fail("{}: key 'rms_norm_eps': expected a number, got {}", label, e->dump());
    c.rms_norm_eps = e->get<double>();
  }
  // Gemma3TextConfig ties the head by default; the other families' configs do not.
  c.tie_word_embeddings = k.boolean("tie_word_embeddings", c.architecture == "Gemma3ForCausalLM");
  if (const auto* q = k.get("quantization_config")) {
    if (!q->is_object()) fail("{}: key 'quantization_config': expected an object", label);
    c.quantization_config = *q;
  }
  c.raw = std::move(j);
  return c;
}

}  // namespace exl3
