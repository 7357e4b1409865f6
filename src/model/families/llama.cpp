// LlamaForCausalLM: RMSNorm, GQA with RoPE (default / linear / llama3 / yarn), SwiGLU MLP.
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_llama(Family& f) {
  dense_layers(f);
}

}  // namespace exl3::model::families
