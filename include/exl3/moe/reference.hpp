// CPU reference MoE (the oracle fused GPU MoE kernels are tested against), all in FP32:
//
//   for every token t and route j:  e = ids[t, j]
//     g = gate_e(x_t), u = up_e(x_t)       EXL3 linears (cpu::linear_forward)
//     a = SiLU(g) * u
//     d = down_e(a)
//   out_t = sum_j weights[t, j] * d_j (summed in route order j = 0..k-1)  + sum of shared experts
//
// Router weights multiply only the expert outputs (never the input), as in the fused kernel.
//
// Rank-sliced layers: gate/up of rank r own intermediate rows [I_loc*r, I_loc*(r+1)) and down is
// K-sliced, so the SwiGLU is separable and rank r's partial is this same computation over its
// slice; the layer output is the sum of the partials over ranks (moe_forward_ranks). Shared
// experts are not sliced: they are added once, to the sum.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "exl3/cpu/linear.hpp"
#include "exl3/moe/router.hpp"
#include "exl3/moe/weights.hpp"

namespace exl3::moe {

// One SwiGLU MLP: down(SiLU(gate(x)) * up(x)). gate/up: [H -> I], down: [I -> H].
struct MlpView {
  cpu::LinearView gate, up, down;

  static MlpView of(const ExpertWeights& e, trellis::Codebook cb);
};

// y[m, H] = the MLP of x[m, H] (overwrites y).
void mlp_forward(const MlpView& mlp, const float* x, int64_t m, float* y);

// out[m, H] = routed experts (+ shared experts) of x[m, H]. `routes` ids index `experts`;
// `shared` may be empty. Overwrites out.
void moe_forward(std::span<const MlpView> experts, const TopK& routes, const float* x, int64_t m,
                 float* out, std::span<const MlpView> shared = {});

// One expert's MLP over the rows routed to it: ys[rows, H] = expert `expert` of xs[rows, H]
// (overwrites ys). Lets callers route to experts that are not EXL3 views (unquantized weights,
// or experts whose inputs are observed).
using ExpertFn = std::function<void(int expert, const float* xs, int64_t rows, float* ys)>;

// out[m, H] = sum over routes j of weights[t, j] * expert_{ids[t, j]}(x_t), each expert called
// once with all the rows routed to it (in token order), the top-k sum per token in route order
// in FP32 -- the same reduction as moe_forward. Overwrites out; no shared experts.
void routed_forward(int num_experts, int64_t hidden, const TopK& routes, const float* x, int64_t m,
                    float* out, const ExpertFn& expert);

// The same over a loaded layer. For a rank-sliced layer this is rank `w.rank`'s partial output.
void moe_forward(const MoeLayerWeights& w, const TopK& routes, const float* x, int64_t m,
                 float* out, std::span<const MlpView> shared = {});

// The full output of a rank-sliced layer: the sum over `ranks` (one MoeLayerWeights per rank
// 0..tp-1, same layer) of their partials, plus the shared experts once.
void moe_forward_ranks(std::span<const MoeLayerWeights> ranks, const TopK& routes, const float* x,
                       int64_t m, float* out, std::span<const MlpView> shared = {});

}  // namespace exl3::moe
