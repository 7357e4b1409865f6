// DeepSeek sparse attention families. GlmMoeDsaForCausalLM (GLM-5.x): DeepSeek-V3's MLA (q LoRA,
// always interleaved RoPE) and MoE (sigmoid grouped router, shared experts), plus DeepSeek sparse
// attention: each layer whose indexer_types entry is "full" runs a lightning indexer (index_n_heads
// x index_head_dim, interleaved RoPE, keep index_topk positions); a "shared" layer reuses the
// previous full layer's selection. mlp_layer_types says which layers are dense (default: the first
// first_k_dense_replace). layer_types must all be deepseek_sparse_attention. MTP layers are not
// loaded.
#include <algorithm>
#include <string>
#include <vector>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {
namespace {

// A list of strings of length `n` under `key`, or empty when absent.
std::vector<std::string> string_list(const Family& f, const char* key, int64_t n) {
  std::vector<std::string> out;
  const nlohmann::json* j = f.keys.get(key);
  if (j == nullptr) return out;
  if (!j->is_array() || static_cast<int64_t>(j->size()) != n) {
    fail("{}: key '{}': expected a list of {} strings (one per layer)", f.label, key, n);
  }
  for (const auto& e : *j) {
    if (!e.is_string()) fail("{}: key '{}': entry {} is not a string", f.label, key, e.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

// transformers' default schedule when indexer_types is absent: index_topk_pattern ("FSSF..."),
// else every layer full except the freq / offset schedule's.
std::vector<std::string> indexer_types(const Family& f) {
  auto types = string_list(f, "indexer_types", f.num_layers);
  if (!types.empty()) return types;
  if (const nlohmann::json* p = f.keys.get("index_topk_pattern")) {
    if (!p->is_string() || static_cast<int64_t>(p->get<std::string>().size()) != f.num_layers) {
      fail("{}: key 'index_topk_pattern': expected a string of {} letters F / S", f.label,
           f.num_layers);
    }
    for (const char c : p->get<std::string>()) {
      if (c != 'F' && c != 'S') fail("{}: key 'index_topk_pattern': letter '{}'", f.label, c);
      types.emplace_back(c == 'F' ? "full" : "shared");
    }
    return types;
  }
  const int64_t freq = std::max<int64_t>(f.keys.integer("index_topk_freq", 1), 1);
  const int64_t offset = f.keys.integer("index_skip_topk_offset", 2);
  for (int64_t i = 0; i < f.num_layers; ++i) {
    types.emplace_back(std::max<int64_t>(i - offset + 1, 0) % freq == 0 ? "full" : "shared");
  }
  return types;
}

}  // namespace

void describe_dsa(Family& f, bool indexer_rope_interleave, bool shared_layers) {
  const ConfigKeys& k = f.keys;
  for (const auto& t : string_list(f, "layer_types", f.num_layers)) {
    if (t != "deepseek_sparse_attention") {
      fail("{}: key 'layer_types': entry '{}' is not supported (only deepseek_sparse_attention)",
           f.label, t);
    }
  }
  MlaAttentionSpec a = deepseek_mla(f, /*rope_interleave=*/true);
  if (a.q_lora_rank == 0) {
    fail("{}: key 'q_lora_rank': the DSA indexer reads the q LoRA latent; null is not supported",
         f.label);
  }
  DsaIndexerSpec ix;
  ix.n_heads = k.integer("index_n_heads");
  ix.head_dim = k.integer("index_head_dim");
  ix.topk = k.integer("index_topk");
  ix.rope_interleave = indexer_rope_interleave;
  if (ix.head_dim < a.qk_rope_head_dim) {
    fail("{}: key 'index_head_dim': {} is below qk_rope_head_dim {} (its first channels are roped)",
         f.label, ix.head_dim, a.qk_rope_head_dim);
  }
  a.indexer = ix;
  f.mla = a;

  std::set<int64_t> dense;
  const auto mlp_types = string_list(f, "mlp_layer_types", f.num_layers);
  if (mlp_types.empty()) {
    dense = first_dense_layers(f);
  } else {
    for (int64_t l = 0; l < f.num_layers; ++l) {
      const auto& t = mlp_types[static_cast<size_t>(l)];
      if (t != "dense" && t != "sparse") {
        fail("{}: key 'mlp_layer_types': entry '{}' is neither dense nor sparse", f.label, t);
      }
      if (t == "dense") dense.insert(l);
    }
  }
  moe_layers(f, grouped_sigmoid_moe(f, "DeepSeek-V3"), dense);

  const auto types =
      shared_layers ? indexer_types(f) : std::vector<std::string>(f.spec.layers.size(), "full");
  for (int64_t l = 0; l < f.num_layers; ++l) {
    const auto& t = types[static_cast<size_t>(l)];
    if (t != "full" && t != "shared") {
      fail("{}: key 'indexer_types': entry '{}' is neither full nor shared", f.label, t);
    }
    if (t == "shared" && l == 0) {
      fail("{}: key 'indexer_types': layer 0 is shared, but no earlier layer selects positions",
           f.label);
    }
    auto& spec = std::get<MlaAttentionSpec>(f.spec.layers[static_cast<size_t>(l)].attention);
    spec.indexer->shared = t == "shared";
  }
}

void describe_glm_moe_dsa(Family& f) {
  describe_dsa(f, /*indexer_rope_interleave=*/true, /*shared_layers=*/true);
}

}  // namespace exl3::model::families
