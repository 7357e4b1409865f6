// MoeSpec -> exl3::moe router call (see moe_routing.hpp).
#include "moe_routing.hpp"

namespace exl3::runtime {

moe::TopK route_moe(const MoeSpec& s, std::span<const float> logits, int64_t m,
                    std::span<const float> correction_bias) {
  if (s.router == RouterKind::kSoftmax) return moe::route_softmax(logits, m, s.num_experts, {s.top_k, s.renormalize});
  moe::SigmoidGroupedRouting r;
  r.top_k = s.top_k;
  r.n_group = s.n_group;
  r.topk_group = s.topk_group;
  r.renormalize = s.renormalize;
  r.routed_scaling_factor = static_cast<float>(s.routed_scaling_factor);
  r.correction_bias = correction_bias;
  return moe::route_sigmoid_grouped(logits, m, s.num_experts, r);
}

}  // namespace exl3::runtime
