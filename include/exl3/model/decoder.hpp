// The decoder-only transformer, written once over the backend op layer (exl3/model/ops.hpp):
// every supported family (Llama, Qwen2, Qwen3, Qwen3-MoE, GLM-4.5-MoE, ...) is this module tree
// with the traits its ModelSpec gives (q/k norm, partial rotary, router kind, shared experts, dense
// layers), run on any backend, whole or as one tensor-parallel rank.
//
//   x = embed(tokens)
//   per layer:  h = rms_norm(x += pending)
//               y = all_reduce(o(attention(q(h), k(h), v(h))))       GQA, or MLA (latent KV),
//                                                  or a gated DeltaNet (recurrent state)
//               h = rms_norm(x += y)
//               y = all_reduce(mlp(h))         gated MLP, or routed experts (+ shared experts)
//               pending = y
// With sandwich norms (Gemma) each block's y is normed (after its all-reduce) before it is
// added: h = rms_norm(x += rms_norm(y)), pending = rms_norm(y).
//   logits = head(rms_norm(x += pending))     only the rows the step wants, vocab gathered
//
// The residual add is folded into the next norm, as the fused CUDA kernel does; a backend that
// keeps the residual stream replicated sees the same bits on every rank.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>
#include <vector>

#include "exl3/model/ops.hpp"
#include "exl3/model/spec.hpp"
#include "exl3/model/tp_plan.hpp"

namespace exl3::model {

struct GqaModules {
  Extent q_heads, kv_heads;  // this rank's (all of them at TP 1)
  int64_t head_dim = 0;
  ModulePtr q, k, v, o, attention;
  // QkNorm::kAcrossHeads: RMSNorms over each token's whole q and k projection, run as ordinary
  // norms before attention (the backends' attention only knows per-head norms).
  ModulePtr q_norm, k_norm;
  bool output_gate = false;  // q_proj gives [query, gate] per head (Qwen3-Next)
};

struct MlaModules {
  int64_t heads = 0, q_lora_rank = 0, qk_head_dim = 0, kv_a_width = 0, v_head_dim = 0;
  ModulePtr q_a, q_a_norm;  // the q LoRA (null with a plain q_proj)
  ModulePtr q;              // q_proj, or q_b_proj after the LoRA
  ModulePtr kv_a, o, attention;
};

struct GatedDeltaNetModules {
  int64_t value_dim = 0;
  // The input projections (qkvz, ba; or Qwen3.5's qkv, z, b, a), their slots and widths.
  std::vector<ModulePtr> in;
  std::vector<Slot> slots;
  std::vector<int64_t> widths;
  ModulePtr mixer, out;
  // Kimi delta attention: the second steps of its forget and output gates (null otherwise).
  ModulePtr f_b, g_b;
  int64_t f_b_width = 0;
};

struct DenseMlpModules {
  int64_t intermediate = 0;  // this rank's channels
  Activation activation = Activation::kSilu;
  ModulePtr gate, up, down;
};

struct MoeModules {
  ModulePtr routed;                       // router + routed experts
  std::optional<DenseMlpModules> shared;  // shared experts, added to the routed sum
  ModulePtr shared_gate;                  // a linear hidden -> 1 gating them (null: ungated)
};

struct LayerModules {
  ModulePtr input_norm, post_norm;
  ModulePtr attention_output_norm, mlp_output_norm;  // sandwich norms (null without)
  std::variant<GqaModules, MlaModules, GatedDeltaNetModules> attention;
  std::variant<DenseMlpModules, MoeModules> mlp;
};

// One rank's view of the model: tp == 1 loads everything whole.
struct RankOf {
  const TpPlan* plan = nullptr;  // nullptr: no tensor parallelism
  int rank = 0;
};

// Loads layer `spec` (cache layer `cache_layer`) through `b`.
LayerModules load_layer(Backend& b, const ModelSpec& model, const LayerSpec& spec, int cache_layer,
                        RankOf rank = {});

struct DecoderModules {
  ModulePtr embedding, final_norm, head;
  std::vector<LayerModules> layers;
};

// Every module of `model` through `b`; `layer_done` is called after each layer.
template <typename OnLayer>
DecoderModules load_decoder(Backend& b, const ModelSpec& model, RankOf rank, OnLayer&& layer_done);
DecoderModules load_decoder_head(Backend& b, const ModelSpec& model, RankOf rank);

// One layer over x [n, hidden]: `pending` is the previous layer's output not yet added to x (null
// at the first layer); returns this layer's output (the Y slot), likewise not yet added.
Act layer_forward(Backend& b, const LayerModules& l, int64_t hidden, Act x, const Act* pending);

// The whole step: embedding, every layer, the logits of the rows the step wants.
void decoder_forward(Backend& b, const DecoderModules& m, int64_t hidden);

template <typename OnLayer>
DecoderModules load_decoder(Backend& b, const ModelSpec& model, RankOf rank, OnLayer&& layer_done) {
  DecoderModules m = load_decoder_head(b, model, rank);
  for (size_t i = 0; i < model.layers.size(); ++i) {
    m.layers.push_back(load_layer(b, model, model.layers[i], static_cast<int>(i), rank));
    layer_done();
  }
  return m;
}

}  // namespace exl3::model
