// Qwen3ForCausalLM: Llama's layer with a per-head RMSNorm of q and k (q_norm / k_norm over
// head_dim) before RoPE.
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_qwen3(Family& f) {
  f.attention.qk_norm = QkNorm::kPerHead;
  dense_layers(f);
}

}  // namespace exl3::model::families
