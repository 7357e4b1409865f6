// MistralForCausalLM: Llama's layer with sliding-window attention: with sliding_window set (not
// null), a query at position p attends to positions p - sliding_window + 1 .. p only
// (transformers' sliding_window_overlay). Mistral 7B v0.1 uses 4096; later releases set null.
#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_mistral(Family& f) {
  if (f.keys.has("layer_types")) {
    fail("{}: key 'layer_types': alternating attention is Ministral's, not MistralForCausalLM's",
         f.label);
  }
  f.attention.sliding_window = f.keys.has("sliding_window") ? f.keys.integer("sliding_window") : 0;
  dense_layers(f);
}

}  // namespace exl3::model::families
