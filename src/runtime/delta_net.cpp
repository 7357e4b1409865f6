// delta_net_forward (exl3/runtime/delta_net.hpp): transformers' recurrent form of the gated delta
// rule, token by token; its chunked form is the same sum in another order.
#include "exl3/runtime/delta_net.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include <tbb/parallel_for.h>

#include "exl3/cpu/activation.hpp"
#include "exl3/format/safetensors.hpp"
#include "exl3/runtime/linear.hpp"

namespace exl3::runtime {
namespace {

using cpu::sigmoid;
using cpu::silu;
using cpu::softplus;

// x / sqrt(sum(x^2) + 1e-6), as transformers' l2norm (the FLA library's epsilon).
void l2norm(float* x, int64_t d) {
  double ss = 0.0;
  for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
  const auto inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6));
  for (int64_t i = 0; i < d; ++i) x[i] *= inv;
}

}  // namespace

DeltaNetWeights load_delta_net_weights(const TensorStore& store,
                                       const model::GatedDeltaNetSpec& s) {
  DeltaNetWeights w;
  w.spec = s;
  if (s.kimi) {  // three convolutions, one per input; A_log [1, 1, heads, 1]
    for (const char* part : {"q", "k", "v"}) {
      const int64_t shape[] = {std::string_view(part) == "v" ? s.value_dim() : s.key_dim(), 1,
                               s.conv_kernel};
      const auto c = load_float_tensor(store, s.prefix + "." + part + "_conv1d.weight", shape);
      w.conv.insert(w.conv.end(), c.begin(), c.end());
    }
    const int64_t a_shape[] = {1, 1, s.num_v_heads, 1};
    w.a = load_float_tensor(store, s.prefix + ".A_log", a_shape);
    w.dt_bias = load_vector(store, s.prefix + ".dt_bias", s.key_dim());
    w.norm = load_vector(store, s.prefix + ".o_norm.weight", s.head_v_dim);
  } else {
    const int64_t conv_shape[] = {s.conv_dim(), 1, s.conv_kernel};  // depthwise: one input each
    w.conv = load_float_tensor(store, s.prefix + ".conv1d.weight", conv_shape);
    w.a = load_vector(store, s.prefix + ".A_log", s.num_v_heads);
    w.dt_bias = load_vector(store, s.prefix + ".dt_bias", s.num_v_heads);
    w.norm = load_vector(store, s.prefix + ".norm.weight", s.head_v_dim);  // not (1 + w)
  }
  for (float& a : w.a) a = std::exp(a);
  return w;
}

DeltaNetState::DeltaNetState(const model::GatedDeltaNetSpec& spec)
    : s(static_cast<size_t>(spec.num_v_heads * spec.head_k_dim * spec.head_v_dim), 0.0f),
      conv(static_cast<size_t>((spec.conv_kernel - 1) * spec.conv_dim()), 0.0f) {}

void delta_net_forward(const DeltaNetWeights& w, DeltaNetState& state, const DeltaNetInputs& in,
                       float* out) {
  const int64_t n = in.n;
  const auto& sp = w.spec;
  const int64_t nk = sp.num_k_heads, nv = sp.num_v_heads, dk = sp.head_k_dim, dv = sp.head_v_dim;
  const int64_t r = sp.v_per_k(), kd = sp.key_dim(), cd = sp.conv_dim(), taps = sp.conv_kernel;
  const int64_t group = 2 * dk + 2 * r * dv;  // one key head's part of in_proj_qkvz
  std::vector<float> mixed(static_cast<size_t>(cd)), conv_out(static_cast<size_t>(cd));
  std::vector<float> z(static_cast<size_t>(nv * dv)), beta(static_cast<size_t>(nv)),
      decay(static_cast<size_t>(nv));
  // KDA: a decay per key channel of every head.
  std::vector<float> channel_decay(static_cast<size_t>(sp.kimi ? nv * dk : 0));
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t t = 0; t < n; ++t) {
    // [q | k | v] for the convolution, and z, b, a: as projected (split_inputs), or from the
    // per-key-head interleaved layout.
    if (sp.kimi) {  // q, k, v, b, f, g
      std::copy_n(in.p[0] + t * kd, kd, mixed.data());
      std::copy_n(in.p[1] + t * kd, kd, mixed.data() + kd);
      std::copy_n(in.p[2] + t * nv * dv, nv * dv, mixed.data() + 2 * kd);
      std::copy_n(in.p[5] + t * nv * dv, nv * dv, z.data());
      for (int64_t h = 0; h < nv; ++h) {
        beta[static_cast<size_t>(h)] = sigmoid(in.p[3][t * nv + h]);
        for (int64_t i = 0; i < dk; ++i) {
          const auto c = static_cast<size_t>(h * dk + i);
          channel_decay[c] = std::exp(-w.a[static_cast<size_t>(h)] *
                                      softplus(in.p[4][t * kd + h * dk + i] + w.dt_bias[c]));
        }
      }
    } else if (sp.split_inputs) {
      std::copy_n(in.p[0] + t * cd, cd, mixed.data());
      std::copy_n(in.p[1] + t * nv * dv, nv * dv, z.data());
      for (int64_t h = 0; h < nv; ++h) {
        const auto hs = static_cast<size_t>(h);
        beta[hs] = sigmoid(in.p[2][t * nv + h]);
        decay[hs] = std::exp(-w.a[hs] * softplus(in.p[3][t * nv + h] + w.dt_bias[hs]));
      }
    }
    const bool interleaved = !sp.split_inputs && !sp.kimi;
    const float* ba = in.p[1];
    for (int64_t g = 0; interleaved && g < nk; ++g) {
      const float* src = in.p[0] + t * sp.qkvz_width() + g * group;
      std::copy_n(src, dk, mixed.data() + g * dk);
      std::copy_n(src + dk, dk, mixed.data() + kd + g * dk);
      std::copy_n(src + 2 * dk, r * dv, mixed.data() + 2 * kd + g * r * dv);
      std::copy_n(src + 2 * dk + r * dv, r * dv, z.data() + g * r * dv);
      for (int64_t j = 0; j < r; ++j) {
        const int64_t h = g * r + j;
        const float b = ba[t * sp.ba_width() + g * 2 * r + j];
        const float a = ba[t * sp.ba_width() + g * 2 * r + r + j];
        beta[static_cast<size_t>(h)] = sigmoid(b);
        decay[static_cast<size_t>(h)] = std::exp(-w.a[static_cast<size_t>(h)] *
                                                 softplus(a + w.dt_bias[static_cast<size_t>(h)]));
      }
    }
    // Causal depthwise convolution over the kept inputs and this one, then SiLU.
    for (int64_t c = 0; c < cd; ++c) {
      const float* wc = w.conv.data() + c * taps;
      float acc = wc[taps - 1] * mixed[static_cast<size_t>(c)];
      for (int64_t j = 0; j + 1 < taps; ++j)
        acc += wc[j] * state.conv[static_cast<size_t>(j * cd + c)];
      conv_out[static_cast<size_t>(c)] = silu(acc);
    }
    if (taps > 1) {
      std::copy(state.conv.begin() + cd, state.conv.end(), state.conv.begin());
      std::copy(mixed.begin(), mixed.end(), state.conv.end() - cd);
    }
    for (int64_t g = 0; g < nk; ++g) {
      l2norm(conv_out.data() + g * dk, dk);
      l2norm(conv_out.data() + kd + g * dk, dk);
      for (int64_t i = 0; i < dk; ++i) conv_out[static_cast<size_t>(g * dk + i)] *= q_scale;
    }
    float* o = out + t * nv * dv;
    tbb::parallel_for(int64_t{0}, nv, [&](int64_t h) {
      const float* q = conv_out.data() + (h / r) * dk;
      const float* k = conv_out.data() + kd + (h / r) * dk;
      const float* v = conv_out.data() + 2 * kd + h * dv;
      float* s = state.s.data() + h * dk * dv;
      float* oh = o + h * dv;
      const float d = decay[static_cast<size_t>(h)], bt = beta[static_cast<size_t>(h)];
      std::vector<float> delta(static_cast<size_t>(dv), 0.0f);
      if (sp.kimi) {  // row i of S decays by its key channel's factor
        const float* cdh = channel_decay.data() + h * dk;
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) s[i * dv + j] *= cdh[i];
      } else {
        for (int64_t i = 0; i < dk * dv; ++i) s[i] *= d;
      }
      for (int64_t i = 0; i < dk; ++i)  // S^T k
        for (int64_t j = 0; j < dv; ++j) delta[static_cast<size_t>(j)] += s[i * dv + j] * k[i];
      for (int64_t j = 0; j < dv; ++j)
        delta[static_cast<size_t>(j)] = (v[j] - delta[static_cast<size_t>(j)]) * bt;
      std::fill_n(oh, dv, 0.0f);
      for (int64_t i = 0; i < dk; ++i) {
        for (int64_t j = 0; j < dv; ++j) {
          s[i * dv + j] += k[i] * delta[static_cast<size_t>(j)];
          oh[j] += s[i * dv + j] * q[i];
        }
      }
      // The gated RMSNorm over the head: norm first, then the weight, then silu(z) (KDA:
      // sigmoid(g)).
      double ms = 0.0;
      for (int64_t j = 0; j < dv; ++j) ms += static_cast<double>(oh[j]) * oh[j];
      const auto inv =
          static_cast<float>(1.0 / std::sqrt(ms / static_cast<double>(dv) + sp.norm_eps));
      const float* zh = z.data() + h * dv;
      for (int64_t j = 0; j < dv; ++j) {
        const float gate = sp.kimi ? sigmoid(zh[j]) : silu(zh[j]);
        oh[j] = oh[j] * inv * w.norm[static_cast<size_t>(j)] * gate;
      }
    });
  }
}

}  // namespace exl3::runtime
