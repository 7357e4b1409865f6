// MistralForCausalLM: Llama's layer with sliding-window attention: with sliding_window set (not
// null), a query at position p attends to positions p - sliding_window + 1 .. p only
// (transformers' sliding_window_overlay). Mistral 7B v0.1 uses 4096; later releases set null.
// MixtralForCausalLM: the same attention, and in every layer a softmax top-k MoE
// (`block_sparse_moe`: router `gate`, experts w1 = gate, w3 = up, w2 = down, each of
// intermediate_size) whose k weights are renormalised to sum to 1.
#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {
namespace {

void sliding_window_attention(Family& f) {
  if (f.keys.has("layer_types")) {
    fail("{}: key 'layer_types': alternating attention is Ministral's, not {}'s", f.label,
         f.config.architecture);
  }
  f.attention.sliding_window = f.keys.has("sliding_window") ? f.keys.integer("sliding_window") : 0;
}

}  // namespace

void describe_mistral(Family& f) {
  sliding_window_attention(f);
  dense_layers(f);
}

void describe_mixtral(Family& f) {
  sliding_window_attention(f);
  MoeSpec moe = routed_experts(f, f.config.num_experts, "num_local_experts", "intermediate_size");
  moe.router = RouterKind::kSoftmax;
  moe.renormalize = true;  // MixtralSparseMoeBlock divides the top-k weights by their sum
  moe.block = "block_sparse_moe";
  moe.expert_proj = {"w1", "w3", "w2"};
  moe_layers(f, moe, {});
}

}  // namespace exl3::model::families
