// What one model family adds to the description every supported family shares. spec.cpp reads
// the keys all of them have (sizes, heads, RoPE, norms, ids) into a Family, then hands it to the
// family's own function, which sets its attention traits and builds each layer's MLP. Adding a
// family is one file here (its function, registered in spec.cpp's table), a row in
// exl3/format/architectures.hpp and its tests.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "exl3/format/checkpoint.hpp"
#include "exl3/format/config_keys.hpp"
#include "exl3/model/spec.hpp"

namespace exl3::model::families {

// The shared part of a description, before the family's function runs.
struct Family {
  const ModelConfig& config;
  const ConfigKeys& keys;
  const std::string& label;             // config.json, for errors
  ModelSpec& spec;                      // architecture, sizes, ids filled in
  GqaAttentionSpec attention;           // heads, head_dim, scale, RoPE; qk_norm false
  std::optional<MlaAttentionSpec> mla;  // set by an MLA family: every layer's attention instead
  int64_t num_layers = 0;
};

// The layers of a model whose MLP is dense SwiGLU everywhere (intermediate_size).
void dense_layers(Family& f);
// The layers of a MoE model: `moe` (prefix filled per layer) except the `dense` ones, which are
// dense SwiGLU of intermediate_size.
void moe_layers(Family& f, const MoeSpec& moe, const std::set<int64_t>& dense);
// num_experts_per_tok and the experts' width (`intermediate_key`), checked against `experts`.
MoeSpec routed_experts(const Family& f, int64_t experts, const char* experts_key,
                       const char* intermediate_key = "moe_intermediate_size");

// transformers' `layer_types` as one flag per layer (true: sliding_attention); nullopt when the
// config has no such key (each family has its own default pattern). Fails naming the key unless it
// lists num_hidden_layers entries, each sliding_attention or full_attention.
std::optional<std::vector<bool>> sliding_layer_types(const Family& f);

// The RoPE of `params` (a transformers rope_parameters object): rope_theta from `theta_key`
// (default `theta`) when params lacks it, the model's max_position_embeddings beside it.
RopeSpec rope_from_parameters(const Family& f, nlohmann::json params, const char* theta_key,
                              double theta, int64_t head_dim);

void describe_llama(Family& f);
void describe_mistral(Family& f);
void describe_mixtral(Family& f);
void describe_qwen2(Family& f);
void describe_qwen3(Family& f);
void describe_qwen3_moe(Family& f);
void describe_glm4_moe(Family& f);
void describe_deepseek_v3(Family& f);
void describe_glm_moe_dsa(Family& f);
void describe_deepseek_v32(Family& f);
void describe_gemma3(Family& f);
void describe_gpt_oss(Family& f);
void describe_minimax_m2(Family& f);
void describe_qwen3_next(Family& f);
// Qwen3.5 text (`moe`: Qwen3_5MoeForCausalLM, else Qwen3_5ForCausalLM).
void describe_qwen3_5(Family& f, bool moe);
void describe_kimi_linear(Family& f);
// DeepSeek sparse attention over DeepSeek-V3's MLA and MoE (GLM-5, DeepSeek-V3.2): the indexer's
// RoPE layout, and whether indexer_types may make layers reuse an earlier selection.
void describe_dsa(Family& f, bool indexer_rope_interleave, bool shared_layers);

// The MTP layers of num_nextn_predict_layers (0 when absent): copies of the last decoder layer's
// description renamed to model.layers.{num_hidden_layers + i} (every family that has them makes
// its MTP block like its last layer: MLA with its own DSA indexer, routed experts).
void describe_mtp(Family& f);

// DeepSeek-V3's MLA attention keys (q LoRA, kv_lora_rank, head dims, RoPE over qk_rope_head_dim,
// the yarn mscale on the softmax scale), shared by the families built on it.
MlaAttentionSpec deepseek_mla(const Family& f, bool rope_interleave);
// The sigmoid router with e_score_correction_bias choosing the best topk_group of n_group groups
// (noaux_tc), routed_scaling_factor and n_shared_experts (GLM-4.5, DeepSeek-V3 and its sparse
// attention successors). `family` names the model in errors.
MoeSpec grouped_sigmoid_moe(const Family& f, std::string_view family);
// Layers 0 .. first_k_dense_replace - 1 (default 1), which are dense before the MoE layers.
std::set<int64_t> first_dense_layers(const Family& f);

}  // namespace exl3::model::families
