// parse_model_config: the parts of an HF config.json that exl3 uses, with type checks.
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"
#include "exl3/format/config_keys.hpp"

namespace exl3 {

ModelConfig parse_model_config(std::string_view json_text, const std::string& label) {
  nlohmann::json j = parse_json_object(json_text, label);
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
