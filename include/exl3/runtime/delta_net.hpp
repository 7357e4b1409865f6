// The gated delta rule of a Gated DeltaNet layer (model::GatedDeltaNetSpec) on the host, in fp32:
// the reference a device kernel is checked against. One call advances one sequence by n tokens
// in order, so prefill in chunks and token-by-token decode give the same state as one pass.
#pragma once

#include <cstdint>
#include <vector>

#include "exl3/model/spec.hpp"

namespace exl3 {
class TensorStore;
}

namespace exl3::runtime {

// A layer's weights besides its linears, as fp32.
struct DeltaNetWeights {
  model::GatedDeltaNetSpec spec;
  std::vector<float> conv;     // [conv_dim, conv_kernel] (conv1d.weight without its unit dim; KDA:
                               // q_conv1d, k_conv1d, v_conv1d one after another)
  std::vector<float> a;        // exp(A_log) [num_v_heads]
  std::vector<float> dt_bias;  // [num_v_heads] (KDA: [key_dim], per channel)
  std::vector<float> norm;     // the gated RMSNorm's weight [head_v_dim] (KDA: o_norm)
};

// Reads a layer's weights besides its linears from `store` (conv1d, A_log as exp(A_log),
// dt_bias and the gated norm's weight; KDA: q/k/v_conv1d, A_log, dt_bias, o_norm), shapes
// checked.
DeltaNetWeights load_delta_net_weights(const TensorStore& store, const model::GatedDeltaNetSpec& s);

// One sequence's state: S of every value head [num_v_heads, head_k_dim, head_v_dim] and the last
// conv_kernel - 1 convolution inputs [conv_kernel - 1, conv_dim], oldest first; zero before the
// first token.
struct DeltaNetState {
  std::vector<float> s, conv;
  explicit DeltaNetState(const model::GatedDeltaNetSpec& spec);
};

// The input projections' outputs for n tokens: qkvz [n, qkvz_width] and ba [n, ba_width]; or with
// split_inputs qkv [n, conv_dim], z [n, value_dim], b [n, num_v_heads] and a [n, num_v_heads];
// or for KDA q, k [n, key_dim], v [n, value_dim], b [n, num_v_heads], f [n, key_dim] (f_b_proj's
// output) and g [n, value_dim] (g_b_proj's).
struct DeltaNetInputs {
  int64_t n = 0;
  const float* p[6] = {};  // qkvz, ba; or qkv, z, b, a; or KDA's q, k, v, b, f, g
};

// -> out [n, value_dim] (the gated norm's output, before out_proj); `state` advances by the n
// tokens.
void delta_net_forward(const DeltaNetWeights& w, DeltaNetState& state, const DeltaNetInputs& in,
                       float* out);

}  // namespace exl3::runtime
