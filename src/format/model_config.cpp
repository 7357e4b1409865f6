// parse_model_config: the parts of an HF config.json that exl3 uses, with type checks.
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/format/checkpoint.hpp"

namespace exl3 {
namespace {

using nlohmann::json;

// HF configs write `null` for unset optional keys; treat it like absence.
const json* get(const json& j, const char* key) {
  const auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

int64_t get_int(const json& j, const char* key, const std::string& label) {
  const json* v = get(j, key);
  if (v == nullptr) return 0;
  if (!v->is_number_integer()) {
    fail("{}: key '{}': expected a non-negative integer, got {}", label, key, v->dump());
  }
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) fail("{}: key '{}': {} is too large", label, key, u);
    return static_cast<int64_t>(u);
  }
  const auto i = v->get<int64_t>();
  if (i < 0) fail("{}: key '{}': expected a non-negative integer, got {}", label, key, i);
  return i;
}

}  // namespace

ModelConfig parse_model_config(std::string_view json_text, const std::string& label) {
  json j;
  try {
    j = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    fail("{}: invalid JSON ({})", label, e.what());
  }
  if (!j.is_object()) fail("{}: must be a JSON object", label);

  ModelConfig c;
  if (const json* a = get(j, "architectures")) {
    if (!a->is_array()) fail("{}: key 'architectures': expected an array of strings", label);
    if (!a->empty()) {
      if (!(*a)[0].is_string()) fail("{}: key 'architectures': entry 0 is not a string", label);
      c.architecture = (*a)[0].get<std::string>();
    }
  }
  if (const json* m = get(j, "model_type")) {
    if (!m->is_string()) fail("{}: key 'model_type': expected a string, got {}", label, m->dump());
    c.model_type = m->get<std::string>();
  }
  c.hidden_size = get_int(j, "hidden_size", label);
  c.intermediate_size = get_int(j, "intermediate_size", label);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", label);
  c.num_attention_heads = get_int(j, "num_attention_heads", label);
  c.num_key_value_heads = get_int(j, "num_key_value_heads", label);
  c.head_dim = get_int(j, "head_dim", label);
  c.vocab_size = get_int(j, "vocab_size", label);
  // Model families spell the expert count differently; the first one present wins.
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (get(j, key) != nullptr) {
      c.num_experts = get_int(j, key, label);
      break;
    }
  }
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok", label);
  c.moe_intermediate_size = get_int(j, "moe_intermediate_size", label);
  c.n_shared_experts = get_int(j, "n_shared_experts", label);
  if (const json* e = get(j, "rms_norm_eps")) {
    if (!e->is_number())
      fail("{}: key 'rms_norm_eps': expected a number, got {}", label, e->dump());
    c.rms_norm_eps = e->get<double>();
  }
  if (const json* t = get(j, "tie_word_embeddings")) {
    if (!t->is_boolean()) {
      fail("{}: key 'tie_word_embeddings': expected true or false, got {}", label, t->dump());
    }
    c.tie_word_embeddings = t->get<bool>();
  }
  if (const json* q = get(j, "quantization_config")) {
    if (!q->is_object()) fail("{}: key 'quantization_config': expected an object", label);
    c.quantization_config = *q;
  }
  c.raw = std::move(j);
  return c;
}

}  // namespace exl3
