// Qwen2ForCausalLM: Llama's layer; q/k/v carry biases, which the linears find in the checkpoint
// (nothing in config.json says so).
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_qwen2(Family& f) {
  dense_layers(f);
}

}  // namespace exl3::model::families
