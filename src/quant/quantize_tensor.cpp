// quantize_tensor: validation, padding, sign draws, then the encoder pipeline of docs/format.md
// (Encoder): Hessian finalisation -> regularisation -> global scale -> tile encoding (LDLQ) ->
// packing.
#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <vector>

#include <tbb/task_arena.h>

#include "exl3/error.hpp"
#include "exl3/quant/quantize.hpp"
#include "exl3/quant/viterbi.hpp"
#include "exl3/trellis/bitstream.hpp"
#include "exl3/trellis/hadamard.hpp"
#include "exl3/trellis/half.hpp"
#include "quant/hessian.hpp"
#include "quant/ldlq.hpp"
#include "quant/regularize.hpp"
#include "quant/scale_search.hpp"

namespace exl3::quant {

namespace tr = exl3::trellis;

namespace {

int64_t pad_128(int64_t n) {
  return (n + tr::kHadDim - 1) / tr::kHadDim * tr::kHadDim;
}

void validate(const float* weight, int64_t in, int64_t out, const QuantOptions& o) {
  if (!tr::valid_bits(o.bits)) fail("quantize_tensor: bits (K) = {} outside 1..8", o.bits);
  if (in <= 0 || out <= 0) fail("quantize_tensor: shape [{}, {}] must be positive", in, out);
  if (weight == nullptr) fail("quantize_tensor: null weight");
  if (!(o.sigma_reg >= 0.0) || !std::isfinite(o.sigma_reg)) {
    fail("quantize_tensor: sigma_reg {} must be finite and >= 0", o.sigma_reg);
  }
  if (!(o.g_scale >= 0.0) || !std::isfinite(o.g_scale)) {
    fail("quantize_tensor: g_scale {} must be finite and >= 0 (0 = search)", o.g_scale);
  }
  if (o.threads < 0) fail("quantize_tensor: threads {} must be >= 0", o.threads);
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      const float v = weight[i * out + j];
      if (!std::isfinite(v))
        fail("quantize_tensor: weight element [{}, {}] is {} (must be finite)", i, j, v);
    }
  }
}

std::vector<float> random_signs(std::mt19937_64& rng, int64_t n) {
  std::vector<float> s(static_cast<size_t>(n));
  for (auto& x : s) x = (rng() >> 63) != 0 ? -1.0f : 1.0f;
  return s;
}

std::vector<uint16_t> to_half(const std::vector<float>& v, const char* name) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    h[i] = tr::float_to_half(v[i]);
    if ((h[i] & 0x7C00u) == 0x7C00u) {
      fail(
          "quantize_tensor: {}[{}] = {} overflows fp16 (weight magnitude too large for EXL3 "
          "scales)",
          name, i, v[i]);
    }
  }
  return h;
}

QuantizedTensor run(const float* weight, int64_t in, int64_t out, const QuantOptions& o,
                    const HessianView* hessian) {
  const int K = o.bits;
  QuantizedTensor r;
  r.bits = K;
  r.codebook = o.codebook;
  r.in_features = in;
  r.out_features = out;
  r.padded_in = pad_128(in);
  r.padded_out = pad_128(out);
  const int64_t rows = r.padded_in, cols = r.padded_out;

  std::mt19937_64 rng(o.seed);
  const std::vector<float> su0 = random_signs(rng, rows);
  const std::vector<float> sign_v = random_signs(rng, cols);

  std::optional<detail::FinalHessian> h;
  if (hessian != nullptr)
    h = detail::finalize_hessian(*hessian, in, rows, su0, o.sigma_reg, o.ldlq);
  r.used_hessian = h.has_value() && h->usable;
  r.ldlq_applied = r.used_hessian && o.ldlq;
  if (r.used_hessian) r.cholesky_retries = h->retries;

  std::vector<float> w(static_cast<size_t>(rows * cols), 0.0f);
  for (int64_t i = 0; i < in; ++i) std::copy_n(weight + i * out, out, w.begin() + i * cols);
  r.out_scales_applied = detail::want_out_scales(o.out_scales, r.used_hessian ? &h->diag : nullptr);
  detail::Regularized reg =
      detail::regularize(std::move(w), rows, cols, su0, sign_v, r.out_scales_applied);

  const double drift = r.ldlq_applied ? detail::ldlq_drift(K) : 1.0;
  r.g_scale = o.g_scale > 0.0
                  ? o.g_scale
                  : detail::search_global_scale(reg.w.data(), rows, cols, K, o.codebook, o.device, drift);
  const auto g = static_cast<float>(r.g_scale);
  double ss = 0.0;
  for (auto& x : reg.w) {
    x *= g;
    ss += static_cast<double>(x) * x;
  }
  for (auto& s : reg.su) s /= g;

  std::vector<uint16_t> states(static_cast<size_t>(rows * cols));
  std::vector<float> q(states.size());
  detail::quantize_blocks(reg.w.data(), rows, cols, r.ldlq_applied ? h->l.data() : nullptr, K,
                          o.codebook, o.device, states.data(), q.data());

  double se = 0.0;
  for (size_t i = 0; i < q.size(); ++i) {
    const double d = static_cast<double>(reg.w[i]) - q[i];
    se += d * d;
  }
  const auto count = static_cast<double>(q.size());
  r.mse_rotated = se / count;
  r.rms_rotated = std::sqrt(ss / count);
  r.nmse_rotated = ss > 0.0 ? se / ss : 0.0;
  r.proxy_err = r.used_hessian
                    ? detail::proxy_error(reg.w.data(), q.data(), h->h_rot.data(), rows, cols)
                    : r.nmse_rotated;

  r.trellis.resize(static_cast<size_t>(rows / 16 * (cols / 16) * tr::tile_words16(K)));
  pack_tiles(states.data(), rows / 16 * (cols / 16), K, r.trellis.data());
  r.suh = to_half(reg.su, "suh");
  r.svh = to_half(reg.sv, "svh");
  return r;
}

}  // namespace

QuantizedTensor quantize_tensor(const float* weight, int64_t in_features, int64_t out_features,
                                const QuantOptions& options, const HessianView* hessian) {
  validate(weight, in_features, out_features, options);
  if (options.threads == 0) return run(weight, in_features, out_features, options, hessian);
  tbb::task_arena arena(options.threads);
  return arena.execute([&] { return run(weight, in_features, out_features, options, hessian); });
}

}  // namespace exl3::quant
