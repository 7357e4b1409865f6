// The model description: one backend-independent account of a decoder-only transformer built
// from config.json (and, for the head, the checkpoint's tensors). Backends (cpu today, cuda
// later) build their modules from it; nothing here touches a weight.
//
// Supported architectures (config.json `architectures[0]`):
//   LlamaForCausalLM     RMSNorm, GQA, RoPE (default / linear / llama3 / yarn), SwiGLU MLP
//   MistralForCausalLM   as Llama, with sliding-window attention (sliding_window)
//   Qwen2ForCausalLM     as Llama; q/k/v biases come from the checkpoint
//   Qwen3ForCausalLM     as Llama with per-head q_norm / k_norm
//   Qwen3MoeForCausalLM  Qwen3 attention; softmax top-k router (norm_topk_prob), layers dense
//                        when listed in mlp_only_layers or off the decoder_sparse_step grid
//   DeepseekV3ForCausalLM  multi-head latent attention (q LoRA or plain q, decoupled RoPE,
//   DeepSeek's
//                        yarn mscale), GLM-4.5's router and shared experts with n_group >= 1
//   DeepseekV32ForCausalLM  DeepSeek-V3's MLA with a DSA indexer in every layer (half-split RoPE)
//   GlmMoeDsaForCausalLM   GLM-5: DeepSeek-V3's MLA (always interleaved RoPE) with a DSA indexer
//                        per layer (indexer_types full / shared), mlp_layer_types dense / sparse
//   Glm4MoeForCausalLM   partial rotary (partial_rotary_factor), optional q/k norm
//                        (use_qk_norm), sigmoid grouped router with e_score_correction_bias,
//                        n_group / topk_group, routed_scaling_factor, shared experts, the first
//                        first_k_dense_replace layers dense; MTP layers are not loaded
//   Gemma3ForCausalLM    Gemma 3 text: sliding / full layers (layer_types or
//                        sliding_window_pattern) with their own RoPE, q/k norm, softmax scale
//                        query_pre_attn_scalar^-0.5, sandwich norms, RMSNorm by (1 + w), the
//                        embedding scaled by sqrt(hidden_size), GeGLU, logit soft-capping
//   GptOssForCausalLM    sliding / full layers (layer_types), attention sinks, q/k/v/o biases,
//                        YaRN RoPE; a biased router (softmax over its top-k logits) and experts
//                        with biases and the clamped SwiGLU, stored fused or per expert
//   MiniMaxM2ForCausalLM Mixtral's layer with q/k norms across all heads (QkNorm::kAcrossHeads),
//                        partial rotary, a sigmoid router whose e_score_correction_bias picks
//                        the top k (renormalised sigmoid weights)
//   Qwen3NextForCausalLM hybrid: gated DeltaNet layers (linear_attention, a recurrent state per
//                        sequence) and gated full-attention layers (layer_types), (1 + w)
//                        RMSNorms, Qwen3-MoE's router with a sigmoid-gated shared expert
//   Qwen3_5ForCausalLM   Qwen3.5 text: Qwen3-Next's layers with the DeltaNet's inputs from four
//   Qwen3_5MoeForCausalLM  projections (in_proj_qkv, _z, _b, _a); dense MLPs, or MoE in every layer
//   KimiLinearForCausalLM  hybrid: Kimi delta attention layers (per-channel decay) and MLA layers
//                        without RoPE, DeepSeek-V3's grouped sigmoid router and shared experts
//
// Anything else fails with an exl3::Error that names config.json and the key at fault: the
// runtime never runs a model it would compute differently from its reference.
//
// Attention is a variant so other kinds (DeepSeek-style MLA, with a compressed KV cache) can be
// added as another alternative without touching the GQA path; every backend visits it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "exl3/format/architectures.hpp"
#include "exl3/format/dtype.hpp"
#include "exl3/model/rope.hpp"

namespace exl3 {
struct ModelConfig;
class Checkpoint;
}  // namespace exl3

namespace exl3::model {

// The supported families and their traits are one table in the format layer
// (exl3/format/architectures.hpp).
using exl3::Architecture;
std::string_view architecture_name(Architecture a);  // the HF class name

// Where RMSNorms `q_norm` / `k_norm` apply to the projected q and k, before RoPE: nowhere, to each
// head over head_dim (Qwen3, Gemma 3, GLM-4.5's use_qk_norm), or to each token's whole projection
// at once, all heads together (MiniMax-M2: weights of num_heads * head_dim and
// num_kv_heads * head_dim, one mean square over every head).
enum class QkNorm : uint8_t { kNone, kPerHead, kAcrossHeads };
std::string_view qk_norm_name(QkNorm n);  // "none", "per_head", "across_heads"

// Grouped-query attention (MHA and MQA are the special cases): q heads h read kv head
// h / (num_heads / num_kv_heads), as transformers' repeat_kv.
struct GqaAttentionSpec {
  std::string prefix;  // "model.layers.3.self_attn": q_proj, k_proj, v_proj, o_proj
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  QkNorm qk_norm = QkNorm::kNone;
  int64_t sliding_window = 0;  // > 0: a query at p sees positions > p - sliding_window only
  // gpt-oss: a learned logit per q head (`sinks` [num_heads]) joins each softmax's denominator,
  // so a head may give less than all of its weight to the positions it sees.
  bool sinks = false;
  // Qwen3-Next: q_proj gives each head [query, gate] (2 * head_dim outputs per head, query
  // first), and the attention output is multiplied by sigmoid(gate) before o_proj.
  bool output_gate = false;
  double scale = 0.0;  // softmax scale, head_dim^-0.5
  RopeSpec rope;

  int64_t q_per_kv() const { return num_heads / num_kv_heads; }
};
// Multi-head latent attention (DeepSeek-V2/V3): per token the cache keeps only the normed latent
// c = kv_a_layernorm(kv_a[:kv_lora_rank]) and one roped key part shared by every head
// (kv_a[kv_lora_rank:]); head h's key is [W_UK_h c, k_rope] and its value W_UV_h c, with W_UK /
// W_UV the rows of kv_b_proj. Queries are q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x))) with a
// q LoRA; each head's query is [nope part, rope part].
// DeepSeek sparse attention (DSA): a lightning indexer scores every earlier position for each
// query, sum_h w_h * relu(q_h . k_j / sqrt(head_dim)) with q = wq_b(q LoRA latent), k =
// LayerNorm(wk(x)) (both roped on their first qk_rope_head_dim channels) and w = weights_proj(x) /
// sqrt(n_heads); attention then reads only the `topk` best positions. A `shared` layer has no
// indexer and reuses the selection of the last layer that has one.
struct DsaIndexerSpec {
  int64_t n_heads = 0;
  int64_t head_dim = 0;
  int64_t topk = 0;
  bool rope_interleave = true;  // GLM-5: interleaved pairs; DeepSeek-V3.2: half split
  bool shared = false;
};

struct MlaAttentionSpec {
  std::string prefix;  // "model.layers.3.self_attn"
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = false;   // RoPE pairs (2i, 2i + 1) instead of (i, i + half)
  double scale = 0.0;             // qk_head_dim^-0.5, times mscale^2 under DeepSeek's yarn
  double latent_norm_eps = 1e-6;  // q_a_layernorm / kv_a_layernorm (transformers' default eps)
  RopeSpec rope;  // over qk_rope_head_dim; rotary_dim 0: no RoPE (Kimi-Linear's MLA, whose
                  // shared "rope" key part is never rotated)
  std::optional<DsaIndexerSpec> indexer;  // sparse attention (needs the q LoRA)

  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};
// Gated DeltaNet (Qwen3-Next's linear_attention layers): no KV cache, a fixed-size state per
// sequence instead. in_proj_qkvz gives, per key head g, [q_g (dk), k_g (dk), v (r * dv), z (r *
// dv)] with r = num_v_heads / num_k_heads value heads per key head; in_proj_ba gives per key head
// [b (r), a (r)]. The concatenation [q | k | v] (conv_dim channels) goes through a causal depthwise
// convolution of conv_kernel taps (bias-free) and SiLU; value head h reads q/k head h / r. With q
// and k L2-normed (eps 1e-6) and q scaled by dk^-0.5, per value head and token:
//   decay = exp(-exp(A_log) * softplus(a + dt_bias)), beta = sigmoid(b)
//   S = decay * S;  S += k (beta * (v - S^T k))^T;  o = S^T q          (S: [dk, dv])
// then o is RMS-normed over dv (eps rms_norm_eps, weight `norm`, not offset), times silu(z), and
// out_proj maps the value heads back to hidden. Qwen3.5 (split_inputs) computes the same from four
// projections: in_proj_qkv ([all q | all k | all v]), in_proj_z, in_proj_b and in_proj_a (one value
// per value head each). The state per sequence is S for every value head
// plus the last conv_kernel - 1 inputs of the convolution.
// Kimi delta attention (KDA, `kimi`) is the same rule with num_k_heads == num_v_heads and
// head_k_dim == head_v_dim, inputs q_proj, k_proj, v_proj (each through its own q/k/v_conv1d of
// the same width), b_proj, and two chained pairs: f = f_b_proj(f_a_proj(x)) and g =
// g_b_proj(g_a_proj(x)). Its decay is per key channel, exp(-exp(A_log[head]) * softplus(f +
// dt_bias)) ([num_heads * head_dim]), multiplying row i of S; the output is normed by `o_norm` and
// multiplied by sigmoid(g) (not silu), then o_proj.
struct GatedDeltaNetSpec {
  std::string prefix;  // "model.layers.0.linear_attn"
  int64_t num_k_heads = 0, num_v_heads = 0;
  int64_t head_k_dim = 0, head_v_dim = 0;
  int64_t conv_kernel = 0;
  double norm_eps = 0.0;
  bool split_inputs = false;  // Qwen3.5's four input projections instead of qkvz / ba
  bool kimi = false;          // Kimi delta attention (above)

  int64_t key_dim() const { return num_k_heads * head_k_dim; }
  int64_t value_dim() const { return num_v_heads * head_v_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  int64_t qkvz_width() const { return 2 * key_dim() + 2 * value_dim(); }
  int64_t ba_width() const { return 2 * num_v_heads; }
  int64_t qkv_width() const { return conv_dim(); }  // split_inputs: in_proj_qkv's outputs
  int64_t v_per_k() const { return num_v_heads / num_k_heads; }
  // floats of one sequence's state: S of every value head, then the convolution's window
  int64_t state_floats() const {
    return num_v_heads * head_k_dim * head_v_dim + conv_dim() * (conv_kernel - 1);
  }
};
// Every backend visits the kind: GQA, MLA (on the CPU backend so far) or gated DeltaNet (CPU).
using AttentionSpec = std::variant<GqaAttentionSpec, MlaAttentionSpec, GatedDeltaNetSpec>;

// The activation of a gated MLP's gate: SiLU (SwiGLU), or GELU's tanh approximation (GeGLU,
// transformers' gelu_pytorch_tanh), or gpt-oss's clamped SwiGLU: with g = min(gate, limit) and
// u = clamp(up, -limit, limit), g * sigmoid(alpha * g) * (u + 1) (MoeSpec::swiglu_*).
enum class Activation : uint8_t { kSilu, kGeluTanh, kClampedSwiglu };

// Gated MLP: down(act(gate(x)) * up(x)).
struct DenseMlpSpec {
  std::string prefix;  // "model.layers.0.mlp": gate_proj, up_proj, down_proj
  int64_t intermediate = 0;
  Activation activation = Activation::kSilu;
};

enum class RouterKind : uint8_t { kSoftmax, kSigmoidGrouped };

struct MoeSpec {
  // "model.layers.3.mlp": gate (router), experts.{E}.{gate,up,down}_proj; Mixtral's
  // "model.layers.3.block_sparse_moe": gate, experts.{E}.{w1,w3,w2}.
  std::string prefix;
  std::string block = "mlp";  // the prefix's last part, which moe_layers appends per layer
  std::array<std::string, 3> expert_proj = {"gate_proj", "up_proj", "down_proj"};
  int64_t num_experts = 0;
  int top_k = 0;
  int64_t intermediate = 0;  // moe_intermediate_size
  RouterKind router = RouterKind::kSoftmax;
  bool renormalize = true;  // norm_topk_prob
  // kSigmoidGrouped only:
  int n_group = 1;
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  bool correction_bias = false;  // a bias [E] added to the scores that choose (not weight) experts
  // Its tensor under the prefix: the router's (DeepSeek, GLM) or the block's (MiniMax-M2).
  std::string correction_bias_name = "gate.e_score_correction_bias";
  std::optional<DenseMlpSpec> shared;  // `shared_experts`, added to the routed output
  // Qwen3-Next: the shared expert's output is multiplied by sigmoid(shared_gate(x)), a linear
  // hidden -> 1 named here under the prefix ("shared_expert_gate"); empty: ungated.
  std::string shared_gate;
  // gpt-oss: the router is `router` (weight and bias), every expert linear has a bias, the
  // activation is the clamped SwiGLU, and transformers stores the experts fused:
  // experts.gate_up_proj [E, hidden, 2 * intermediate] (gate and up channels interleaved, gate
  // first), experts.down_proj [E, intermediate, hidden], both read as x @ W, with
  // gate_up_proj_bias [E, 2 * intermediate] and down_proj_bias [E, hidden]. Converted checkpoints
  // hold them per expert under expert_proj's names. (OpenAI's release stores the fused tensors as
  // MXFP4: exl3/format/fused_experts.hpp reads both.)
  std::string router_name = "gate";
  bool router_bias = false;
  bool expert_bias = false;
  Activation activation = Activation::kSilu;
  double swiglu_alpha = 0.0, swiglu_limit = 0.0;  // kClampedSwiglu only

  // Whether the exl3::moe expert kernels compute these experts (SiLU, no biases).
  bool plain_experts() const { return activation == Activation::kSilu && !expert_bias; }
};
using MlpSpec = std::variant<DenseMlpSpec, MoeSpec>;

struct LayerSpec {
  int index = 0;
  std::string prefix;  // "model.layers.3"
  AttentionSpec attention;
  MlpSpec mlp;
  std::string input_norm;           // tensor names (RMSNorm weights [hidden])
  std::string post_attention_norm;  // the norm before the MLP
  // Sandwich norms (Gemma): the attention's and the MLP's outputs are normed before their
  // residual adds. Empty: the output is added as it is.
  std::string attention_output_norm;
  std::string mlp_output_norm;

  // The layer's DSA indexer (full or shared), or nullptr when its attention is not sparse.
  const DsaIndexerSpec* dsa_indexer() const {
    const auto* mla = std::get_if<MlaAttentionSpec>(&attention);
    return mla != nullptr && mla->indexer ? &*mla->indexer : nullptr;
  }
};

// A multi-token-prediction (MTP) layer: DeepSeek-V3 / V3.2 and GLM-5 checkpoints store
// num_nextn_predict_layers of them after the decoder layers, as model.layers.{num_hidden_layers +
// i}. Position p of an MTP layer reads the target's last hidden state h_p (after its final norm)
// and the embedding e of the token at p + 1 (zeroed at position 0), and predicts the token at
// p + 2:  x = eh_proj(concat(enorm(e), hnorm(h_p))), g = block(x) (a decoder layer with its own
// KV cache), logits = head(head_norm(g)). Drafting k tokens chains: g stands in for h at the next
// position. The target never reads these layers; they are loaded only for MTP drafting.
struct MtpLayerSpec {
  LayerSpec block;           // the decoder block, named like a target layer at its index
  std::string enorm, hnorm;  // RMSNorm weights [hidden]
  std::string eh_proj;       // linear prefix, 2 * hidden -> hidden
  std::string head_norm;     // shared_head.norm.weight
  std::string head;          // shared_head.head, or the target's head when the layer has none
  bool head_tied = false;    // `head` is the embedding matrix (the target's tied head)
  std::string embed_tokens;  // the layer's own embed_tokens, or the target's
};

struct ModelSpec {
  Architecture architecture = Architecture::kLlama;
  std::string label;  // config.json (what errors name)
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 0.0;
  int64_t max_position_embeddings = 0;  // 0 when absent
  bool tie_word_embeddings = false;
  std::string embed_tokens = "model.embed_tokens.weight";
  std::string final_norm = "model.norm.weight";
  // The output projection: an EXL3 or unquantized linear prefix ("lm_head"), or, when
  // lm_head_tied, the embedding matrix itself.
  std::string lm_head = "lm_head";
  bool lm_head_tied = false;
  std::vector<int32_t> eos_token_ids;  // config.json eos_token_id (number or list)
  std::optional<int32_t> bos_token_id;
  // Gemma: every RMSNorm scales by (1 + weight) rather than weight.
  bool norm_unit_offset = false;
  // Gemma: token embeddings are multiplied by sqrt(hidden_size) (see embedding_scale).
  bool scale_embedding = false;
  double final_logit_softcapping = 0.0;  // > 0: logits z -> c * tanh(z / c)
  std::vector<LayerSpec> layers;
  // config.json num_nextn_predict_layers (DeepSeek-V3 / V3.2, GLM-5): described whether or not
  // the checkpoint holds their tensors, which only loading an MTP head checks.
  std::vector<MtpLayerSpec> mtp_layers;

  int64_t num_layers() const { return static_cast<int64_t>(layers.size()); }
  bool is_moe() const;
  // Whether some layer keeps a recurrent state instead of a KV cache (gated DeltaNet): such a
  // sequence cannot be rewound or continued from cached pages.
  bool has_recurrent_layers() const;
};

// The description from config.json alone (lm_head assumed untied unless tie_word_embeddings).
// `label` names config.json in errors.
ModelSpec describe_model(const ModelConfig& config, const std::string& label);
// The description of a checkpoint: its config.json, and the head from its tensors (exllamav3
// writes lm_head even for tied models; the embedding is used only when no lm_head exists and
// tie_word_embeddings is set).
ModelSpec describe_model(const Checkpoint& ckpt);

// The factor token embeddings are multiplied by: 1, or with scale_embedding sqrt(hidden_size)
// rounded to the embedding's stored dtype, since transformers casts the scale to the weight's
// dtype before multiplying (sqrt(3072) is 55.5 in bf16); the product itself stays fp32.
float embedding_scale(const ModelSpec& spec, DType stored);

// The MTP layers of a checkpoint's description with the heads and embeddings it holds: each
// layer's own shared_head.head and embed_tokens where present, else the target's.
void resolve_mtp_tensors(ModelSpec& spec, const Checkpoint& ckpt);

// A summary for `--json` outputs and logs.
nlohmann::json spec_summary(const ModelSpec& spec);

}  // namespace exl3::model
