// Qwen3MoeForCausalLM: Qwen3's attention; a softmax top-k router over num_experts
// (norm_topk_prob renormalizes the k weights); a layer is dense when mlp_only_layers lists it or
// it falls off the decoder_sparse_step grid. No shared expert.
#include <fmt/format.h>

#include "exl3/error.hpp"
#include "model/families/family.hpp"

namespace exl3::model::families {

void describe_qwen3_moe(Family& f) {
  const ConfigKeys& k = f.keys;
  f.attention.qk_norm = QkNorm::kPerHead;
  MoeSpec moe = routed_experts(f, f.config.num_experts, "num_experts");
  moe.router = RouterKind::kSoftmax;
  moe.renormalize = k.boolean("norm_topk_prob", false);  // Qwen3MoeConfig's default
  const int64_t step = k.integer("decoder_sparse_step", 1);
  if (step == 0) fail("{}: key 'decoder_sparse_step' is 0; expected >= 1", f.label);
  std::set<int64_t> dense;
  for (const int64_t l : k.int_list("mlp_only_layers")) {
    if (l >= f.num_layers) {
      fail("{}: key 'mlp_only_layers': layer {} is outside 0..{}", f.label, l, f.num_layers - 1);
    }
    dense.insert(l);
  }
  for (int64_t l = 0; l < f.num_layers; ++l)
    if ((l + 1) % step != 0) dense.insert(l);
  if (k.integer("shared_expert_intermediate_size", 0) != 0) {
    fail("{}: key 'shared_expert_intermediate_size': Qwen3-MoE has no shared expert", f.label);
  }
  moe_layers(f, moe, dense);
}

}  // namespace exl3::model::families
