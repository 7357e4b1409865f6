// Routing of one MoE layer as its MoeSpec describes it (softmax top-k or sigmoid grouped), shared
// by the single-rank and the tensor-parallel CPU engines (internal).
#pragma once

#include <cstdint>
#include <span>

#include "exl3/moe/router.hpp"
#include "exl3/model/spec.hpp"

namespace exl3::runtime {
// The runtime runs the model layer's descriptions and plans: their names are its vocabulary.
using namespace exl3::model;  // NOLINT(google-build-using-namespace)

// Routes of m tokens from their router logits [m, num_experts]; `correction_bias` is
// e_score_correction_bias (kSigmoidGrouped with correction_bias only, else empty).
moe::TopK route_moe(const MoeSpec& s, std::span<const float> logits, int64_t m,
                    std::span<const float> correction_bias);

}  // namespace exl3::runtime
